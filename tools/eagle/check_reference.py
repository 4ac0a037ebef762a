#!/usr/bin/env python3
"""Self-checks of the PyTorch reference on random tiny models (CPU or GPU).

    python3 tools/eagle/check_reference.py

1. The target's masked path (explicit causal mask, explicit positions) and
   its fused causal path agree, and both agree with plain softmax attention.
2. The draft heads' training-time test and the tree drafting agree: with
   topk=1, the logits of tree depth k equal those of training step k.
3. Speculative generation returns exactly the target's greedy output for
   every (num_steps, topk, num_draft_tokens) setting, and the trees have the
   requested size with parents before children.
"""

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "train"))
sys.path.insert(0, str(HERE))
import model as M  # noqa: E402
import spec_decode as SD  # noqa: E402
from train_heads import make_head, ttt_forward, ttt_masks  # noqa: E402

SETTINGS = [(3, 1, 4), (5, 4, 8), (6, 8, 32)]


def tiny(device):
    shape = M.LlamaShape(hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    t = M.Target(shape)
    t.init_weights(0)
    # Large random weights give peaked, prompt-dependent predictions, so
    # drafts are sometimes right and sometimes wrong.
    with torch.no_grad():
        for p in t.parameters():
            if p.dim() == 2:
                p.mul_(12.0)
    return t.to(device).eval()


def check_attention(t, device):
    ids = torch.randint(0, 256, (2, 40), device=device)
    a = t(ids)[0]
    mask = torch.ones(40, 40, dtype=torch.bool, device=device).tril()[None, None]
    b = t(ids, torch.arange(40, device=device)[None], mask)[0]
    old = M.attend
    M.attend = M.attend_reference
    try:
        c = t(ids)[0]
    finally:
        M.attend = old
    e1, e2 = (a - b).abs().max().item(), (a - c).abs().max().item()
    print(f"attention paths: masked vs causal {e1:.2e}, fused vs reference {e2:.2e}")
    assert e1 < 1e-4 and e2 < 1e-4


def check_ttt_vs_tree(t, head, aux, device):
    steps = 4
    prompt = [M.BOS] + list(b"The draft and the tree")
    seq = prompt + [ord("!")]
    n = len(seq) - 1
    feats = SD.target_features_of(t, head, seq[:-1], aux)
    chain = SD.draft_tree(t, head, seq, feats, steps, 1, steps + 1)
    x = torch.tensor(seq + [c.token for c in chain], device=device)[None]
    _, _, outs = ttt_forward(head, t, x, ttt_masks(x.shape[1], steps, device), aux, steps, amp=False)
    # Recompute the tree's per-depth logits by re-running draft_tree with
    # fewer steps would hide bugs; instead compare the argmax path and the
    # top-1 probability along it, which are functions of those logits.
    worst = 0.0
    for k in range(steps):
        lg = outs[k][0][0, n - 1].float()
        p = lg.softmax(-1)
        tok = int(p.argmax())
        if head.kind == "eagle3":
            tok = int(head.to_target_ids(torch.tensor(tok)))
        assert tok == chain[k].token, (head.kind, k, tok, chain[k].token)
        want = chain[k].score / (chain[k - 1].score if k else 1.0)
        worst = max(worst, abs(float(p.max()) - want))
    print(f"{head.kind}: training-time test matches tree drafting (prob err {worst:.1e})")
    assert worst < 1e-4


def check_generation(t, head, aux, device):
    prompts = [[M.BOS] + list(s.encode()) for s in ["Hello, world", "int main(", "%%%"]]
    for ns, k, nd in SETTINGS:
        lens_all = []
        for pr in prompts:
            ref = SD.greedy(t, pr, 40)
            out, lens = SD.speculative(t, head, pr, 40, ns, k, nd, aux)
            assert out == ref, (head.kind, (ns, k, nd), out, ref)
            lens_all += lens
            seq = pr + ref[:5]
            feats = SD.target_features_of(t, head, seq[:-1], aux)
            nodes = SD.draft_tree(t, head, seq, feats, ns, k, nd)
            assert len(nodes) == nd - 1
        print(f"{head.kind} {(ns, k, nd)}: output == greedy, mean acceptance "
              f"{sum(lens_all) / len(lens_all):.2f}")


def check_verify(t):
    """Hand-built tree: the greedy chain g1..g3 with wrong siblings placed
    before it, and a wrong subtree; verify must accept g1..g3, bonus g4."""
    prompt = [M.BOS] + list(b"Verify me")
    g = SD.greedy(t, prompt, 6)
    seq = prompt + [g[0]]
    nodes, parent = [], None
    for d in range(1, 4):
        wrong = SD.Node((g[d] + 1) % 256, parent, d, 0.0, len(nodes), None)
        nodes.append(wrong)
        nodes.append(SD.Node((g[d] + 2) % 256, wrong, d + 1, 0.0, len(nodes), None))
        right = SD.Node(g[d], parent, d, 0.0, len(nodes), None)
        nodes.append(right)
        parent = right
    nodes.sort(key=lambda nd: nd.depth)       # parents before children
    acc, bonus = SD.verify(t, seq, nodes)
    assert acc == g[1:4] and bonus == g[4], (acc, bonus, g)
    print("verify: hand-built tree accepted the greedy chain plus bonus")


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    t = tiny(device)
    check_attention(t, device)
    with torch.no_grad():
        check_verify(t)
    aux = M.eagle3_aux_layers(t.cfg.num_hidden_layers)
    for kind in ["eagle", "eagle3"]:
        head = make_head(kind, t, 3).to(device).eval()
        with torch.no_grad():
            for p in head.parameters():
                if p.dim() == 2:
                    p.mul_(10.0)
            check_ttt_vs_tree(t, head, aux, device)
            check_generation(t, head, aux, device)
    print("reference checks passed")


if __name__ == "__main__":
    main()
