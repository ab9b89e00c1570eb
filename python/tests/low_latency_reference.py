"""The low-latency combine's result, computed with torch as docs/SEMANTICS.md defines it."""


def low_latency_combined(torch, x, weights, idx, experts_per_rank: int, num_ranks: int):
    """combine(dispatch(x)) with every expert the identity: each rank holding some of a token's
    experts sums weight_k * x over them (k order, each product rounded, float) and rounds that to
    BF16; the token's rank adds those sums in rank order and rounds to BF16."""
    accumulated = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    owners = torch.where(idx >= 0, idx // experts_per_rank, -1)
    for owner in range(num_ranks):
        partial = torch.zeros_like(accumulated)
        for k in range(idx.shape[1]):
            product = weights[:, k:k + 1] * x.float()
            partial = torch.where(owners[:, k:k + 1] == owner, partial + product, partial)
        holds = (owners == owner).any(dim=1, keepdim=True)
        accumulated = torch.where(holds, accumulated + partial.to(torch.bfloat16).float(), accumulated)
    return accumulated.to(torch.bfloat16)


def calc_diff(x, y) -> float:
    """deep_ep's measure of how far two results are apart: 1 - 2 sum(xy) / sum(x^2 + y^2) over
    x + 1 and y + 1, in double."""
    x, y = x.double() + 1, y.double() + 1
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()
