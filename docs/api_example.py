"""The Python API in one screen, on the tiny random target: it runs in seconds on a CPU, and every call is the same
on `smollm2_135m` with the committed mini drafter or on `qwen3_8b` with the released one (drop the overrides).

    python docs/api_example.py
"""
import tempfile

import specexp

# 1. A target and a drafter, named as on the command line; overrides are the command line's key=value.
pipe = specexp.load(target="tiny_qwen3", drafter="dflash", overrides=["drafter.init=random", "device=cpu"])

# 2. Generate: a user message, a chat, or token ids. τ counts the bonus token (tokens committed per verification).
outs = pipe.generate(["What is 12 * 7?", [{"role": "user", "content": "Name a river."}]], max_new_tokens=16)
for o in outs:
    print(f"tau {o.tau:.2f}  accept lengths {o.accept_lengths}  {len(o.token_ids)} tokens  {o.text[:40]!r}")

# 3. The same autoregressively: greedy speculative decoding is lossless, so the tokens are the same.
ar = specexp.load(target="tiny_qwen3", drafter="none", overrides=["device=cpu"]).generate("What is 12 * 7?", 16)
assert ar[0].token_ids == outs[0].token_ids

# 4. Evaluate and compare: the summaries the command line writes, returned as dicts.
small = ["target=tiny_qwen3", "drafter.init=random", "device=cpu", "logger=none", "eval.warmup=0",
         "eval.progress=false", "benchmark=gsm8k", "eval.num_samples=2", "eval.max_new_tokens=8"]
with tempfile.TemporaryDirectory() as d:
    a = specexp.evaluate(small, out_dir=f"{d}/b4")
    b = specexp.evaluate([*small, "drafter.block_size=8"], out_dir=f"{d}/b8")
    print("macro tau", a["macro"]["tau"], "vs", b["macro"]["tau"])
    paired = specexp.compare(f"{d}/b4", f"{d}/b8")
    print("paired over", paired["turns_compared"], "turns: macro", paired["macro"])

# 5. Bad input is one line, raised as specexp.UserError (the command line prints the same line and exits 2).
try:
    specexp.load(drafter="dflsh")
except specexp.UserError as e:
    print("UserError:", e)
