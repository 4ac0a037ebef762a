"""Reference EAGLE tree drafting and greedy verification (batch size 1).

Written for clarity, not speed: every cycle recomputes the target and the
draft prefix from scratch instead of keeping KV caches, so it is a plain
statement of what an engine with caches must reproduce.

One cycle, with sequence s_0..s_n (s_n = newest token, not yet seen by the
target) and target features F_0..F_{n-1} (F_t = what the target hands the
head at position t: its final normed hidden state for EAGLE, the
concatenated streams entering layers 2, L//2, L-3 for EAGLE-3):

1. Draft prefix: the head runs causally over the pairs (s_{t+1}, F_t) at
   positions t = 0..n-1. The last pair is the root; its logits give the
   depth-1 candidates.
2. Tree (SGLang's num_steps / topk / num_draft_tokens): step 0 keeps the
   root's top-k tokens, scored by their probability. Each later step runs the
   head once on each of the k frontier nodes (input: the node's token and the
   hidden output of its parent's step; position: root position + depth;
   attention: all prefix pairs, the root and the node's ancestors), takes each
   node's top-k children, scores them by parent score x child probability,
   and keeps the k best of the k*k as the next frontier. All scored
   candidates (k + (num_steps-1)*k*k) compete; the tree is the root plus the
   num_draft_tokens-1 best (ties go to the earlier candidate, so a parent
   always precedes its children).
3. Verify: the target runs once over s_0..s_n plus the tree nodes (node at
   depth d sits at position n+d and attends to s_0..s_n and its ancestors).
   Starting at the root, it accepts the child whose token equals the target's
   argmax there, and repeats; the argmax at the last accepted node is the
   bonus token. A cycle yields accepted + 1 tokens (its acceptance length).
"""

import torch

from model import EOS


def _probs_topk(head, logits, k):
    p = logits.float().softmax(-1)
    val, idx = p.topk(k, dim=-1)
    if head.kind == "eagle3":
        idx = head.to_target_ids(idx)
    # One transfer instead of a device sync per element.
    return val.cpu().tolist(), idx.cpu().tolist()


class Node:
    __slots__ = ("token", "parent", "depth", "score", "order", "hidden_in", "kv")

    def __init__(self, token, parent, depth, score, order, hidden_in):
        self.token, self.parent, self.depth = token, parent, depth
        self.score, self.order, self.hidden_in = score, order, hidden_in
        self.kv = None  # the node's own draft key/value once it was expanded


def draft_tree(target, head, seq, feats, num_steps, topk, num_draft):
    """Returns the chosen nodes (parents before children). seq: list of ids
    s_0..s_n; feats: [n, F] features of positions 0..n-1."""
    dev = feats.device
    n = len(seq) - 1
    embed = target.model.embed_tokens
    lm_head = target.lm_head if head.kind == "eagle" else None
    toks = torch.tensor(seq[1:], device=dev)[None]
    pos = torch.arange(n, device=dev)[None]
    logits, out, (pk, pv) = head.step(embed(toks), feats[None], pos, None, None, lm_head)
    root_hidden = out[0, -1]
    val, idx = _probs_topk(head, logits[0, -1], topk)
    cands = []
    frontier = []
    for j in range(topk):
        node = Node(idx[j], None, 1, val[j], len(cands), root_hidden)
        cands.append(node)
        frontier.append(node)
    expanded = []  # nodes whose keys/values are in the draft cache
    for _ in range(1, num_steps):
        m = len(frontier)
        q_tok = torch.tensor([nd.token for nd in frontier], device=dev)[None]
        q_hid = torch.stack([nd.hidden_in for nd in frontier])[None]
        q_pos = torch.tensor([n - 1 + nd.depth for nd in frontier], device=dev)[None]
        # Keys: prefix (incl. root) | expanded nodes | the frontier itself.
        keys = [pk] + [nd.kv[0] for nd in expanded]
        vals = [pv] + [nd.kv[1] for nd in expanded]
        past = (torch.cat(keys, dim=2), torch.cat(vals, dim=2))
        mask = torch.zeros(m, n + len(expanded) + m, dtype=torch.bool)  # built on the CPU
        mask[:, :n] = True
        for i, nd in enumerate(frontier):
            anc = nd.parent
            while anc is not None:
                mask[i, n + expanded.index(anc)] = True
                anc = anc.parent
            mask[i, n + len(expanded) + i] = True
        logits, out, (k_new, v_new) = head.step(embed(q_tok), q_hid, q_pos,
                                                mask.to(dev)[None, None], past, lm_head)
        for i, nd in enumerate(frontier):
            nd.kv = (k_new[:, :, i:i + 1], v_new[:, :, i:i + 1])
            expanded.append(nd)
        val, idx = _probs_topk(head, logits[0], topk)          # [m, k]
        children = []
        for i, nd in enumerate(frontier):
            for j in range(topk):
                c = Node(idx[i][j], nd, nd.depth + 1, nd.score * val[i][j],
                         len(cands), out[0, i])
                cands.append(c)
                children.append(c)
        children.sort(key=lambda c: (-c.score, c.order))
        frontier = children[:topk]
    chosen = sorted(cands, key=lambda c: (-c.score, c.order))[:num_draft - 1]
    chosen.sort(key=lambda c: c.order)
    keep = set(map(id, chosen))
    for c in chosen:  # guaranteed by the tie rule; checked because engines rely on it
        assert c.parent is None or id(c.parent) in keep
    return chosen


def verify(target, seq, nodes):
    """Greedy verification. Returns (accepted tokens, bonus token)."""
    dev = target.lm_head.weight.device
    n = len(seq) - 1
    m = len(nodes)
    index = {id(nd): n + 1 + i for i, nd in enumerate(nodes)}
    ids = torch.tensor(seq + [nd.token for nd in nodes], device=dev)[None]
    pos = torch.tensor(list(range(n + 1)) + [n + nd.depth for nd in nodes], device=dev)[None]
    L = n + 1 + m
    mask = torch.ones(L, L, dtype=torch.bool).tril()    # built on the CPU
    mask[n + 1:, n + 1:] = False
    for i, nd in enumerate(nodes):
        r = n + 1 + i
        mask[r, r] = True
        anc = nd.parent
        while anc is not None:
            mask[r, index[id(anc)]] = True
            anc = anc.parent
    logits = target(ids, pos, mask.to(dev)[None, None])[0][0]
    pred_at = logits.argmax(-1).cpu().tolist()
    children = {}
    for nd in nodes:
        key = index[id(nd.parent)] if nd.parent is not None else n
        children.setdefault(key, {})[nd.token] = index[id(nd)]
    cur, accepted = n, []
    while True:
        pred = pred_at[cur]
        nxt = children.get(cur, {}).get(pred)
        if nxt is None:
            return accepted, pred
        accepted.append(pred)
        cur = nxt


@torch.no_grad()
def target_features_of(target, head, seq_prefix, aux):
    ids = torch.tensor(seq_prefix, device=target.lm_head.weight.device)[None]
    logits, h, caught = target(ids, capture=aux)
    if head.kind == "eagle":
        return h[0]
    return torch.cat([caught[i][0] for i in aux], dim=-1)


@torch.no_grad()
def greedy(target, prompt, max_new):
    seq = list(prompt)
    dev = target.lm_head.weight.device
    for _ in range(max_new):
        logits = target(torch.tensor(seq, device=dev)[None])[0]
        seq.append(int(logits[0, -1].argmax()))
        if seq[-1] == EOS:
            break
    return seq[len(prompt):]


@torch.no_grad()
def speculative(target, head, prompt, max_new, num_steps, topk, num_draft, aux):
    """Greedy speculative generation. Returns (new tokens, acceptance lengths
    per verify cycle)."""
    dev = target.lm_head.weight.device
    seq = list(prompt)
    logits = target(torch.tensor(seq, device=dev)[None])[0]
    seq.append(int(logits[0, -1].argmax()))        # the first token has no draft
    lens = []
    while len(seq) - len(prompt) < max_new and seq[-1] != EOS:
        feats = target_features_of(target, head, seq[:-1], aux)
        nodes = draft_tree(target, head, seq, feats, num_steps, topk, num_draft)
        accepted, bonus = verify(target, seq, nodes)
        lens.append(len(accepted) + 1)
        seq += accepted + [bonus]
        if EOS in accepted:          # stop at the first end of text
            seq = seq[:seq.index(EOS, len(prompt)) + 1]
    return seq[len(prompt):len(prompt) + max_new], lens
