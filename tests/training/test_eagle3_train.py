"""EAGLE-3 training (training/eagle3_module.py): the training-time-test forward against a step-by-step recomputation
through the drafter's own inference layer, overfitting one sequence, the draft vocabulary from frequencies, the
soft-label (distillation) loss against the hard one and against a loop written from its definition, and
`task=train drafter=eagle3` (both label kinds) through the real pipeline to a checkpoint that loads and drafts
losslessly."""
import json

import pytest
import torch
from conftest import BASE, make_cfg

from specexp.decoding.engine import DecodeConfig, generate
from specexp.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3DraftModel
from specexp.drafters.layers import init_weights
from specexp.errors import UserError
from specexp.training import data as D
from specexp.training import pipeline
from specexp.training.eagle3_module import (
    Eagle3LitModule,
    d2t_of,
    draft_vocab,
    t2d_index,
    teacher,
    ttt_forward,
    ttt_labels,
    ttt_recipe,
)

TAPS = [0, 1, 3]


def sequence(target, text="Tell me a story about a lighthouse.", n=24):
    ids = target.encode_chat([{"role": "user", "content": text}])
    ref = generate(target, None, ids, DecodeConfig(max_new_tokens=n))
    return D.Sequence("one", torch.tensor(ids + ref.tokens), torch.tensor([0] * len(ids) + [1] * n).bool())


def random_model(target, vd=None, seed=0, scale=1.0):
    model = init_weights(Eagle3DraftModel(Eagle3Config.for_target(target, vd, TAPS)), seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model


def test_ttt_forward_equals_a_step_by_step_recomputation(tiny_target):
    """Step j at index p = the chain drafted from p: the real pairs 0..p through the layer (causal), then j steps
    each feeding (own output, embedding of ids[p+1+i]) at position p+i with the cache of everything before."""
    t = tiny_target
    model = random_model(t, scale=8.0).double().eval()     # larger weights: attention far from uniform
    ids = torch.randint(0, 5000, (11,), generator=torch.Generator().manual_seed(1))
    _, taps = t.forward(ids[None], 0, t.new_cache(), taps=TAPS)
    taps = taps[0].double()

    def embed(x):
        return t.embed_tokens(x).double()

    length, s = 4, ids.numel()
    with torch.no_grad():
        outs = ttt_forward(model, embed, taps, ids, length)
        assert len(outs) == length and outs[0].shape == (s, t.hidden_size)
        for p in range(s - 1):
            n = p + 1                                                   # pairs 0..p: (tap_q, token q+1)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            h, kv = model(model.features(taps[None, :n]), embed(ids[None, 1:n + 1]), torch.arange(n),
                          None, causal)
            h = h[:, -1:]
            torch.testing.assert_close(outs[0][p], h[0, 0], atol=1e-9, rtol=1e-9)
            for j in range(1, length):
                if p + 1 + j >= s:
                    break
                h, (k, v) = model(h, embed(ids[None, p + 1 + j: p + 2 + j]), torch.tensor([p + j]), kv)
                kv = (torch.cat([kv[0], k], 2), torch.cat([kv[1], v], 2))
                torch.testing.assert_close(outs[j][p], h[0, 0], atol=1e-9, rtol=1e-9)
    lab, use = ttt_labels(ids, torch.ones(s, dtype=torch.bool), 2)
    assert lab[:s - 4].tolist() == ids[4:].tolist() and use.tolist() == [True] * (s - 4) + [False] * 4


def test_the_draft_vocabulary_is_the_most_frequent_response_tokens_and_d2t_maps_it():
    seqs = [D.Sequence("a", torch.tensor([9, 7, 7, 5, 5, 5, 3]), torch.tensor([0, 1, 1, 1, 1, 1, 1]).bool()),
            D.Sequence("b", torch.tensor([9, 9, 9, 8, 3, 2]), torch.tensor([0, 0, 0, 1, 1, 1]).bool())]
    # response counts: 5 x3, 3 x2, 7 x2, 8 x1, 2 x1 (9 only in prompts). Ties go to the lower id.
    used = draft_vocab(seqs, 12, 4)
    assert used.tolist() == [2, 3, 5, 7]
    assert torch.equal(used, draft_vocab(list(reversed(seqs)), 12, 4))            # deterministic, order-free
    d2t = d2t_of(used)
    assert d2t.tolist() == [2, 2, 3, 4] and (torch.arange(4) + d2t).tolist() == [2, 3, 5, 7]
    t2d = t2d_index(d2t, 12)
    assert [int(t2d[i]) for i in (2, 3, 5, 7)] == [0, 1, 2, 3] and int((t2d >= 0).sum()) == 4
    # fewer distinct response tokens than asked for: topped up with the lowest unused ids
    assert draft_vocab(seqs, 12, 8).tolist() == [0, 1, 2, 3, 4, 5, 7, 8]
    assert draft_vocab(seqs, 12, None).tolist() == list(range(12))
    # a model holding the map drafts target ids
    model = Eagle3DraftModel(Eagle3Config(hidden_size=8, intermediate_size=8, num_attention_heads=2,
                                          num_key_value_heads=1, head_dim=4, vocab_size=12, draft_vocab_size=4,
                                          target_hidden_size=8))
    model.d2t.copy_(d2t)
    assert model.to_target(torch.arange(4)).tolist() == [2, 3, 5, 7]


def test_the_draft_vocabulary_is_eagle3_s_frequency_count():
    """Against EAGLE-3's own construction (EAGLE traineagle3 / SpecForge generate_vocab_mapping_file: a Counter of
    the loss-masked tokens, most_common(N), sorted ascending, d2t = used - arange, t2d = membership), on Zipf-like
    token data of 20 sequences: the same vocabulary wherever the count at the cut is not tied; at a tied cut every
    token above the tied count is in and the tied ones taken are the lowest ids (here; EAGLE's Counter takes them
    in the order they first occur in its data, which this construction does not depend on)."""
    from collections import Counter

    g = torch.Generator().manual_seed(0)
    weights = 1.0 / torch.arange(1, 3001, dtype=torch.float64) ** 1.1                       # Zipf over 3,000 ids
    perm = torch.randperm(3000, generator=g)                                                # frequency != id order
    seqs = []
    for i in range(20):
        n = int(torch.randint(40, 200, (1,), generator=g))
        ids = perm[torch.multinomial(weights, n, replacement=True, generator=g)]
        mask = torch.arange(n) >= int(torch.randint(5, 30, (1,), generator=g))              # a prompt, then response
        seqs.append(D.Sequence(str(i), ids, mask))
    counter = Counter()
    for s_ in seqs:
        counter.update(s_.ids[s_.loss_mask].tolist())
    counts = sorted(counter.values(), reverse=True)
    untied = [n for n in range(50, len(counts)) if counts[n - 1] > counts[n]][:5]
    tied = [n for n in range(50, len(counts)) if counts[n - 1] == counts[n]][:5]
    assert untied and tied
    for n in untied:
        ref = sorted(k for k, _ in counter.most_common(n))
        used = draft_vocab(seqs, 3000, n)
        assert used.tolist() == ref, n
        d2t = d2t_of(used)
        t2d = t2d_index(d2t, 3000)
        assert ((torch.arange(n) + d2t) == torch.tensor(ref)).all()
        assert (t2d >= 0).nonzero().flatten().tolist() == ref                               # EAGLE's bool t2d
    for n in tied:
        cut = counts[n - 1]
        used = set(draft_vocab(seqs, 3000, n).tolist())
        above = {k for k, c in counter.items() if c > cut}
        at_cut = sorted(k for k, c in counter.items() if c == cut)
        assert above <= used and used - above == set(at_cut[: n - len(above)])


def test_overfitting_one_sequence_drives_step0_accuracy_up(tiny_target):
    t = tiny_target
    seq = sequence(t)
    vd = 256
    used = draft_vocab([seq], t.vocab_size, vd)
    model = random_model(t, vd)
    model.d2t.copy_(d2t_of(used))
    m = Eagle3LitModule(model, t, ttt_length=3, ttt_decay=0.8, lr=0, warmup_ratio=0, weight_decay=0, tap_layers=TAPS)
    _, taps = t.forward(seq.ids[None], 0, t.new_cache(), taps=TAPS)
    taps = taps[0].clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    torch.manual_seed(0)
    first = None
    for step in range(150):
        loss, metrics = m.ttt_loss(seq.ids, seq.loss_mask, taps)
        if first is None:
            first = (float(loss.detach()), float(metrics["acc_k0"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        loss, metrics = m.ttt_loss(seq.ids, seq.loss_mask, taps)
    # measured: acc_k0 0.04 -> 1.0, loss 13.5 -> 0.016, tau_sim 3.88 of at most 4
    assert first[1] < 0.2 and float(metrics["acc_k0"]) > 0.95, (first, metrics)
    assert float(loss) < 0.05 * first[0], (first, float(loss))
    assert float(metrics["acc_k2"]) > 0.9 and float(metrics["tau_sim"]) > 3.5, metrics


# ------------------------------------------------------------------------------------------ soft labels
def soft_setup(t, vd, seed=0):
    """One regenerated sequence, a random drafter over the `vd` most frequent of its response tokens, the module,
    the taps and the target's last hidden state (tap L-1)."""
    seq = sequence(t)
    used = draft_vocab([seq], t.vocab_size, vd)
    model = random_model(t, vd, seed=seed)
    model.d2t.copy_(d2t_of(used))
    m = Eagle3LitModule(model, t, ttt_length=3, ttt_decay=0.8, lr=0, warmup_ratio=0, weight_decay=0, tap_layers=TAPS,
                        labels="soft")
    logits, feats = t.forward(seq.ids[None], 0, t.new_cache(), taps=m.feature_layers)
    feats = feats[0].clone()
    return seq, m, feats[:, :3 * t.hidden_size], feats[:, 3 * t.hidden_size:], logits[0]


def test_teacher_is_the_target_s_own_distribution_restricted_to_the_draft_vocabulary(tiny_target):
    """Tap L-1 through the target's lm_head is the target's logits (transformers returns the last hidden state after
    the final norm): the teacher rows are softmax(logits[used]) at the positions before response tokens, and `top`
    the draft id of the full-vocabulary argmax (-1 outside the draft vocabulary)."""
    t = tiny_target
    seq, m, _, last, logits = soft_setup(t, 16)
    torch.testing.assert_close(t.lm_head(last), logits, rtol=1e-5, atol=1e-5)
    soft = teacher(t.lm_head, last, seq.loss_mask, m.used, m.t2d, chunk_rows=7)      # several chunks
    s = seq.ids.numel()
    need = [q for q in range(s - 1) if seq.loss_mask[q + 1]]
    assert soft.row.tolist() == [need.index(q) if q in need else -1 for q in range(s)]
    torch.testing.assert_close(soft.p, torch.softmax(logits[need][:, m.used], -1), rtol=1e-5, atol=1e-6)
    top = [int(m.t2d[logits[q].argmax()]) if q in need else -1 for q in range(s)]
    assert soft.top.tolist() == top and -1 in [top[q] for q in need] and max(top) >= 0   # both cases occur


def test_soft_loss_with_a_one_hot_target_equals_the_hard_loss(tiny_target):
    """A target distribution that is one-hot on the data token (logits 0 there, -inf elsewhere) gives the hard loss,
    its gradient and its metrics exactly: same positions counted (the data token = the argmax; outside the draft
    vocabulary: not counted), same normalisation."""
    t = tiny_target
    seq, m, taps, _, _ = soft_setup(t, 16)
    s, ids = seq.ids.numel(), seq.ids
    one_hot = torch.full((s, t.vocab_size), float("-inf"))
    one_hot[torch.arange(s - 1), ids[1:]] = 0.0                                         # row q -> token q+1
    soft = teacher(lambda x: x, one_hot, seq.loss_mask, m.used, m.t2d)
    outside = int((m.t2d[ids[seq.loss_mask]] < 0).sum())
    assert 0 < outside < int(seq.loss_mask.sum())                  # some labels are masked, some count
    params = [p for p in m.model.parameters() if p.requires_grad]
    hard_loss, hard_m = m.ttt_loss(ids, seq.loss_mask, taps)
    soft_loss, soft_m = m.ttt_loss(ids, seq.loss_mask, taps, soft)
    torch.testing.assert_close(soft_loss, hard_loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(torch.autograd.grad(soft_loss, params), torch.autograd.grad(hard_loss, params)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert soft_m.keys() == hard_m.keys() and all(torch.equal(soft_m[k], hard_m[k]) for k in hard_m)


def reference_soft_loss(m, ids, loss_mask, taps, logits, entropy=False):
    """The documented loss, position by position: step j, index p counts when p+2+j < S, loss_mask[p+2+j] and the
    target's argmax at p+1+j (full vocabulary) is in the draft vocabulary; its term is -sum_v p[v] log q[v] with p the
    target's softmax over the draft vocabulary at p+1+j; CE_j = the mean of step j's terms; loss = sum_j 0.8^j CE_j.
    `entropy`: the same with -sum p log p (the loss's floor). Returns (loss, counted, skipped for the argmax)."""
    used = m.used.tolist()
    outs = ttt_forward(m.model, m.embed, taps, ids, m.ttt_length)
    total, counted, skipped = 0.0, 0, 0
    for j in range(m.ttt_length):
        terms = []
        for p in range(ids.numel()):
            if p + 2 + j >= ids.numel() or not loss_mask[p + 2 + j]:
                continue
            q = p + 1 + j
            if int(logits[q].argmax()) not in used:
                skipped += 1
                continue
            target_p = torch.softmax(logits[q, used].double(), -1)
            logq = target_p.log() if entropy else torch.log_softmax(m.model.logits(outs[j][p]).double(), -1)
            terms.append(-(target_p * logq).sum())
        counted += len(terms)
        total = total + 0.8 ** j * torch.stack(terms).mean()
    return total, counted, skipped


def test_soft_loss_masks_and_normalises_as_documented(tiny_target):
    """Against the loop above, on a target distribution whose argmax is outside the draft vocabulary at some
    positions (those carry no loss even though part of their mass is inside); prompt positions carry none either."""
    t = tiny_target
    seq, m, taps, _, _ = soft_setup(t, 16)
    ids, s = seq.ids, seq.ids.numel()
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(s, t.vocab_size, generator=g)
    peak = torch.where(torch.arange(s) % 3 == 0, torch.tensor(5000), m.used[torch.arange(s) % len(m.used)])
    logits[torch.arange(s), peak] += 12.0                 # every third argmax outside the vocabulary (id 5000)
    logits[:, m.used] += 3.0 * torch.randn(s, len(m.used), generator=g)      # spread mass over the draft vocabulary
    assert 5000 not in m.used.tolist()
    soft = teacher(lambda x: x, logits, seq.loss_mask, m.used, m.t2d)
    with torch.no_grad():
        loss, metrics = m.ttt_loss(ids, seq.loss_mask, taps, soft)
        ref, counted, skipped = reference_soft_loss(m, ids, seq.loss_mask, taps, logits)
    assert counted > 0 and skipped > 0
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    # the counted positions matter: the same loss normalised by every position (SpecForge's mean) differs
    assert abs(float(ref) * counted / (counted + skipped) - float(loss)) > 1e-3


def test_soft_training_distils_the_target(tiny_target):
    """Training on the real target's distribution (tap L-1 through its lm_head) drives the loss down to near its
    floor, the target's own entropy: the KL to the target shrinks (measured: 1.48 -> 0.003 nats in 150 steps, acc_k0
    0.04 -> 1.0)."""
    t = tiny_target
    seq, m, taps, last, logits = soft_setup(t, 256)
    soft = teacher(t.lm_head, last, seq.loss_mask, m.used, m.t2d)
    with torch.no_grad():
        floor, counted, _ = reference_soft_loss(m, seq.ids, seq.loss_mask, taps, logits, entropy=True)
        first, _ = m.ttt_loss(seq.ids, seq.loss_mask, taps, soft)
    assert counted > 0
    opt = torch.optim.AdamW([p for p in m.model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(150):
        loss, _ = m.ttt_loss(seq.ids, seq.loss_mask, taps, soft)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        last_loss, metrics = m.ttt_loss(seq.ids, seq.loss_mask, taps, soft)
    kl_first, kl_last = float(first) - float(floor), float(last_loss) - float(floor)
    assert kl_first > 0.5 and 0 <= kl_last < 0.1 * kl_first, (kl_first, kl_last)
    assert float(metrics["acc_k0"]) > 0.9, metrics            # its argmax is the target's argmax


def test_labels_option_and_the_stage_hash():
    """hard leaves the recorded recipe as it was before the option (so an existing hard-label stage is reused);
    soft adds itself; anything else is one line."""
    assert ttt_recipe({"labels": "hard"}) == {"ttt_length": 7, "ttt_decay": 0.8}
    assert ttt_recipe({"labels": "soft"}) == {"ttt_length": 7, "ttt_decay": 0.8, "labels": "soft"}
    assert ttt_recipe({}) == ttt_recipe({"labels": "soft"})                            # the group's default
    with pytest.raises(UserError, match=r"^drafter.labels='medium' is not valid; expected hard \(the data"):
        ttt_recipe({"labels": "medium"})


@pytest.mark.slow
@pytest.mark.parametrize("labels, features", [("soft", "cache"), ("hard", "online")])
def test_train_drafter_eagle3_writes_a_checkpoint_that_loads_and_is_lossless(tiny_target, tmp_path, monkeypatch,
                                                                           labels, features):
    """Soft labels read the target's last hidden state beside the taps: from the feature cache (built with the
    extra layer) here, computed in the step in the hard run."""
    t = tiny_target
    monkeypatch.setenv("SPECEXP_CACHE", str(tmp_path / "cache"))
    cfg = make_cfg([*BASE, "drafter=eagle3", "drafter.init=random", "drafter.draft_vocab_size=1024",
                    f"drafter.labels={labels}", f"data.features={features}",
                    f"drafter.tap_layers=[{','.join(map(str, TAPS))}]", "drafter.ttt_length=3", "task=train",
                    "train=smoke", "train.max_steps=6", "data=smoke", f"paths.cache={tmp_path / 'cache'}",
                    "train.eval_after=true", "benchmark=gsm8k", "eval.num_samples=1", "eval.max_new_tokens=12",
                    f"train.export_dir={tmp_path / 'export'}"])
    card = pipeline.run_train(cfg, tmp_path / "run")
    assert card["steps"] == 6 and card["kind"] == "eagle3"
    assert card["facts"]["draft_vocab"] == "the 1024 most frequent response tokens of the training data"
    assert 0 < card["facts"]["draft_vocab_coverage"] <= 1 and card["facts"]["ttt_length"] == 3
    assert card["facts"]["labels"].startswith(f"{labels}:")
    if features == "cache":                                 # the taps, then the last layer (the teacher's input)
        metas = [json.loads(f.read_text()) for f in (tmp_path / "cache").rglob("features-*/meta.json")]
        assert [m["layer_ids"] for m in metas] == [[*TAPS, t.num_layers - 1]]
    assert "train/acc_k0" in card["final_metrics"] and "train/tau_sim" in card["final_metrics"]
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["benchmarks"]["gsm8k"]["lossless_mismatches"] == 0
    model = Eagle3DraftModel.from_pretrained(tmp_path / "export")
    assert model.config.draft_vocab_size == 1024 and model.config.tap_layers == TAPS
    assert model.fc.weight.dtype == torch.bfloat16 and model.embed_tokens is None
    seqs = pipeline.context(cfg).seqs
    assert torch.equal(model.to_target(torch.arange(1024)), draft_vocab(seqs, t.vocab_size, 1024))
    drafter = Eagle3Drafter(model.float(), t, num_drafts=4)
    ids = t.encode_chat([{"role": "user", "content": "Name three prime numbers."}])
    ref = generate(t, None, ids, DecodeConfig(max_new_tokens=24))
    assert generate(t, drafter, ids, DecodeConfig(max_new_tokens=24)).tokens == ref.tokens
    # the stage is reused
    again = pipeline.run_train(cfg, tmp_path / "run2")
    assert again["run_dir"] == card["run_dir"] and again["train_seconds"] == card["train_seconds"]


def test_init_from_target_copies_what_fits(tiny_target):
    from specexp.training.eagle3_module import init_from_target

    t = tiny_target
    used = torch.arange(0, 4096, 4)
    model = random_model(t, len(used))
    model.d2t.copy_(d2t_of(used))
    copied = init_from_target(model, t)
    top = t.model.model.layers[-1]
    assert set(copied) == {"midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
                           "midlayer.mlp.down_proj.weight", "midlayer.self_attn.o_proj.weight",
                           "midlayer.post_attention_layernorm.weight", "norm.weight", "lm_head.weight"}
    assert torch.equal(model.midlayer.mlp.down_proj.weight, top.mlp.down_proj.weight)
    assert torch.equal(model.lm_head.weight, t.lm_head.weight[used])
