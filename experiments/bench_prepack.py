"""What `target.prepack` buys one target forward on this CPU: blocks of 1, 2, 4 and 8 rows (an AR step and verifies
of 1, 3 and 7 drafts) after a 100-token prompt, with the linear layers packed (the plan `target.prepack=auto`
measured here, targets/cpu_linear.py) and plain (`F.linear`), interleaved within every repeat so that a change of
load falls on both. Prints ms per forward (median over repeats) and each block in AR steps of its own variant; the
CPU, its flags, the threads and the load go in the header.

    python experiments/bench_prepack.py --threads 2 --repeats 12 target.dtype=float32

CPU wall clock: run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def main() -> None:
    from hydra import compose, initialize_config_dir

    from specexp import registry
    from specexp.machine import cpu_info
    from specexp.paths import CONF_DIR
    from specexp.targets import cpu_linear

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2_135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("overrides", nargs="*", help="config overrides (e.g. target.dtype=float32)")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", [f"target={args.target}", "device=cpu", "target.engine=static", *args.overrides])
    target = registry.build_target(cfg.target, torch.device("cpu"))
    packed = [m for m in target.model.modules() if "packed_kind" in vars(m)]
    forwards = {m: m.forward for m in packed}
    if not packed:
        raise SystemExit(f"target.prepack packed nothing here ({target.dtype}): nothing to compare")

    def use(on: bool) -> None:                      # plain: the class's own forward, F.linear
        for m in packed:
            if on:
                m.forward = forwards[m]
            else:
                vars(m).pop("forward", None)

    rows, ms = (1, 2, 4, 8), {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = target.new_cache(512)
        target.forward(torch.randint(100, 40000, (1, 100), generator=g), 0, cache)
        blocks = {n: torch.randint(100, 40000, (1, n), generator=g) for n in rows}
        for i in range(args.repeats + 1):
            for on in (False, True):
                use(on)
                for n in rows:
                    t0 = time.perf_counter()
                    target.forward(blocks[n], 100, cache)
                    target.rollback(cache, n)
                    if i:                             # the first round warms up
                        ms.setdefault((on, n), []).append(1e3 * (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in ms.items()}
    info = cpu_info()
    flags = ", ".join(f for f, on in info["flags"].items() if on)
    print(f"# target.prepack on {args.target}, {target.dtype}, static engine, after a 100-token prompt\n\n"
          f"CPU {info['model']} ({info['cores']} cores; flags: {flags}); {args.threads} thread(s); load before "
          f"{load_before:.2f}{' (BUSY)' if load_before > 0.5 else ''}, after {os.getloadavg()[0]:.2f}; "
          f"{args.repeats} repeats, interleaved; plan {json.dumps(cpu_linear.describe(target.model))}\n\n"
          "| rows | plain ms | plain, AR steps | packed ms | packed, AR steps | packed / plain |\n"
          "|---:|---:|---:|---:|---:|---:|")
    for n in rows:
        p, q = med[False, n], med[True, n]
        print(f"| {n} | {p:.1f} | {p / med[False, 1]:.2f} | {q:.1f} | {q / med[True, 1]:.2f} | {q / p:.2f} |")


if __name__ == "__main__":
    main()
