"""The Python API's bad input (issue #49, rows 1-4): every row raises `specexp.UserError` with one line naming the
bad value, before any generation, and writes nothing; a chat message is one conversation, a string is one override;
two threads share a pipeline by taking turns; internal invariants are checks that `python -O` keeps."""
import ast
import threading
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

import specexp

SMALL = ["target=tiny_qwen3", "drafter.init=random", "device=cpu", "logger=none", "eval.max_new_tokens=8"]
SRC = Path(__file__).resolve().parents[1] / "src" / "specexp"


@pytest.fixture(scope="module")
def pipe():
    GlobalHydra.instance().clear()
    yield specexp.load(drafter="dflash", overrides=SMALL)
    GlobalHydra.instance().clear()


GENERATE = [  # (arguments, fragment of the one line)
    ((None,), "a prompt is a str, a chat message {'role', 'content'}, a list of such messages or a list of token "
              "ids (ints), or a list of prompts; got a NoneType"),
    ((123,), "or a list of prompts; got a int"),
    ((b"hi",), "or a list of prompts; got a bytes"),
    ((torch.tensor([1, 2, 3]),), "got a Tensor (pass tensor.tolist())"),
    ((["ok", 5],), "prompts[1]: a prompt is a str"),
    (([],), "no prompts: pass one prompt or a non-empty list of them"),
    (([[-1, 5]],), "a non-empty list of token ids in [0, 151936)"),
    (("hi",), None),                                   # the good call the keyword rows below change
]
KEYWORDS = [
    ({"seed": "abc"}, "seed='abc' is not valid; expected an int >= 0 or None"),
    ({"seed": 1.5}, "seed=1.5 is not valid; expected an int >= 0 or None"),
    ({"seed": -1}, "seed=-1 is not valid"),
    ({"max_new_tokens": 0}, "max_new_tokens=0 is not valid; expected an int >= 1 or None"),
    ({"max_new_tokens": "8"}, "max_new_tokens='8' is not valid"),
]


@pytest.mark.parametrize("args, fragment", [g for g in GENERATE if g[1]], ids=lambda x: str(x)[:30])
def test_a_bad_prompt_is_one_line(pipe, args, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(specexp.UserError) as e:
        pipe.generate(*args)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())                                    # nothing written


@pytest.mark.parametrize("kw, fragment", KEYWORDS, ids=lambda x: str(x)[:30])
def test_a_bad_generate_keyword_is_one_line(pipe, kw, fragment):
    with pytest.raises(specexp.UserError) as e:
        pipe.generate("hi", **kw)
    assert str(e.value).startswith(fragment) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, fragment", [
    ({"overrides": 5}, "overrides is a list of 'key=value' strings, not a int"),
    ({"overrides": ["eval.max_new_tokens=4", ("a", "b")]}, "overrides are 'key=value' strings; got tuple"),
    ({"overrides": [3]}, "overrides are 'key=value' strings; got int '3'"),
    ({"target": 5}, "target=5 is not valid; expected a config name (str) or None"),
    ({"overrides": [*SMALL, "eval.batch_size=2"]},              # issue #59 row 12: it ran at batch 1, silently
     "eval.batch_size=2: a Pipeline's generate decodes its prompts one at a time (batch 1), so the setting would "
     "be ignored"),
], ids=lambda x: str(x)[:30])
def test_a_bad_load_argument_is_one_line(kw, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    with pytest.raises(specexp.UserError) as e:
        specexp.load(**kw)
    assert str(e.value).startswith(fragment) and "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("decoding", ["B", "block"])
def test_a_tree_pipeline_refuses_a_protocol_that_cannot_verify_trees(tree_pipe, decoding):
    """Issue #59 row 3: `generate(decoding="B")` on a tree drafter was a raw ValueError from the engine."""
    with pytest.raises(specexp.UserError) as e:
        tree_pipe.generate("hi", decoding=decoding)
    assert str(e.value).startswith(f"decoding={decoding!r} cannot verify draft trees") and "\n" not in str(e.value)
    assert tree_pipe.generate("hi", decoding="A", seed=0)[0].token_ids          # the pipeline still generates


@pytest.fixture(scope="module")
def tree_pipe():
    GlobalHydra.instance().clear()
    yield specexp.load(drafter="dflash", overrides=[*SMALL, "drafter.mode=tree"])
    GlobalHydra.instance().clear()


def test_a_string_is_one_override_and_none_is_none():
    from specexp.api import _overrides

    assert _overrides("eval.max_new_tokens=4") == ["eval.max_new_tokens=4"]     # not split into characters
    assert _overrides(None) == [] and _overrides(("a=1", "b=2")) == ["a=1", "b=2"]
    GlobalHydra.instance().clear()
    cfg, _ = specexp.api.compose("eval.max_new_tokens=4")
    assert cfg.eval.max_new_tokens == 4


def test_a_chat_message_is_one_conversation(pipe):
    msg = {"role": "user", "content": "hi"}
    one, = pipe.generate(msg)                                  # not two prompts "role" and "content"
    assert one.token_ids == pipe.generate([msg])[0].token_ids == pipe.generate("hi")[0].token_ids
    assert [o.token_ids for o in pipe.generate([[msg], "hi"])] == [one.token_ids] * 2


def test_two_threads_take_turns_on_one_pipeline(pipe):
    want = [o.token_ids for o in pipe.generate(["Count to five.", "Name a river."])]
    got, errors = {}, []

    def work(i, prompt):
        try:
            got[i] = pipe.generate(prompt)[0].token_ids
        except Exception as e:                                # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, p)) for i, p in enumerate(["Count to five.", "Name a river."])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [got[0], got[1]] == want


def test_tau_is_none_when_no_verification_ran(pipe):
    out, = pipe.generate("hi", max_new_tokens=1)              # the prefill alone made the one token
    assert out.accept_lengths == [] and out.tau is None and len(out.token_ids) == 1


def test_no_assert_guards_state_in_the_package():
    """`python -O` drops asserts: an invariant of the package is `errors.invariant` (or a `check`)."""
    found = [f"{p.relative_to(SRC)}:{n.lineno}" for p in SRC.rglob("*.py")
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Assert)]
    assert not found, found
