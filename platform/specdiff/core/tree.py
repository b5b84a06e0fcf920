"""K candidate drafts merged into a prefix trie, scored by the verifier in one tree-attention pass.

Node 0 is the root: the last token of the prefix, whose logits the verifier has not computed yet. Nodes 1..N are
the distinct (prefix-of-candidate) paths, in the order first met. A node attends to the cached prefix, to the root
and to its ancestors; its position id is ``prefix_len + depth``. So shared prefixes among candidates are computed
once, and the verifier's distribution at node n is p(. | s, path(n)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenTree:
    tokens: torch.Tensor  # [N+1] long; tokens[0] is the root (the pending prefix token)
    parents: torch.Tensor  # [N+1] long; parents[0] == -1
    depth: torch.Tensor  # [N+1] long; depth[0] == 0
    paths: torch.Tensor  # [C, gamma] long; node index of each distinct candidate's j-th token
    candidates: torch.Tensor  # [C, gamma] long; the distinct candidates, in order of first appearance
    candidate_of: torch.Tensor  # [K] long; for each input candidate, its row in ``candidates``

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return int(self.tokens.shape[0])

    def attention_mask(self) -> torch.Tensor:
        """[N+1, N+1] bool: entry (i, k) is True when node i may attend to node k (k is i or an ancestor of i)."""
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        parents = self.parents.tolist()
        for i in range(1, n):  # parents always precede children, so row parent is complete
            mask[i] |= mask[parents[i]]
        return mask

    def parent_rows(self) -> torch.Tensor:
        """[C, gamma] long: for each candidate position j, the node whose distribution predicts token j."""
        root = torch.zeros_like(self.paths[:, :1])
        return torch.cat([root, self.paths[:, :-1]], dim=1)


def build_tree(root_token: int, candidates: torch.Tensor) -> TokenTree:
    """Merge candidates [K, gamma] into a trie below ``root_token``; duplicate candidates collapse to one row."""
    if candidates.dim() != 2 or candidates.shape[1] < 1:
        raise ValueError(f"candidates must have shape [K, gamma] with gamma >= 1, got {tuple(candidates.shape)}")
    tokens, parents, depth = [root_token], [-1], [0]
    children: dict[tuple[int, int], int] = {}
    distinct: dict[tuple[int, ...], int] = {}
    paths, rows, candidate_of = [], [], []
    for cand in candidates.tolist():
        key = tuple(cand)
        if key in distinct:
            candidate_of.append(distinct[key])
            continue
        node, path = 0, []
        for d, tok in enumerate(cand, start=1):
            child = children.get((node, tok))
            if child is None:
                child = len(tokens)
                children[(node, tok)] = child
                tokens.append(tok)
                parents.append(node)
                depth.append(d)
            node = child
            path.append(node)
        distinct[key] = len(rows)
        candidate_of.append(len(rows))
        rows.append(cand)
        paths.append(path)
    return TokenTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depth=torch.tensor(depth, dtype=torch.long),
        paths=torch.tensor(paths, dtype=torch.long),
        candidates=torch.tensor(rows, dtype=torch.long),
        candidate_of=torch.tensor(candidate_of, dtype=torch.long),
    )


def chain(root_token: int, tokens: list[int]) -> TokenTree:
    """A single-path tree (no draft when ``tokens`` is empty): used by plain decoding and K=1."""
    if not tokens:
        empty = torch.zeros(1, 0, dtype=torch.long)
        return TokenTree(
            tokens=torch.tensor([root_token]),
            parents=torch.tensor([-1]),
            depth=torch.tensor([0]),
            paths=empty,
            candidates=empty,
            candidate_of=torch.zeros(1, dtype=torch.long),
        )
    return build_tree(root_token, torch.tensor([tokens]))
