"""deep_ep.utils.math's helpers, as deep_ep's tests call them: FP8 casts per 128 channels,
similarity, rank de-duplication, hashes of tensors."""

from typing import Any, Tuple

_E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-4
_GROUP = 128  # channels per FP8 scale


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def safe_div(a, b) -> float:
    """a / b, and 0 for 0 / 0."""
    if b == 0 and a == 0:
        return 0
    return a / b


def calc_diff(x: Any, y: Any) -> float:
    """1 minus the cosine-like similarity of x + 1 and y + 1 (in float64): 0 for equal tensors."""
    x, y = x.double() + 1, y.double() + 1
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def per_token_cast_to_fp8(x: Any) -> Tuple[Any, Any]:
    """[m, n] -> (e4m3 [m, n], float32 scales [m, ceil(n / 128)]): each group of 128 channels of a
    row scaled so that its largest magnitude (at least 1e-4) becomes 448."""
    import torch

    if x.dim() != 2:
        raise ValueError(f"per_token_cast_to_fp8: x must be 2-D, got {tuple(x.shape)}")
    m, n = x.shape
    padded = torch.nn.functional.pad(x, (0, align(n, _GROUP) - n)).view(m, -1, _GROUP)
    amax = padded.abs().float().amax(dim=2).clamp(min=_AMAX_FLOOR)
    cast = (padded * (_E4M3_MAX / amax.unsqueeze(2))).to(torch.float8_e4m3fn)
    return cast.view(m, -1)[:, :n].contiguous(), amax / _E4M3_MAX


def per_token_cast_back(x_fp8: Any, x_scales: Any) -> Any:
    """The BF16 rows of (e4m3 [m, n], scales): float32 [m, n / 128], or int32 UE8M0 words (four
    exponent bytes each, deep_ep's packed layout)."""
    import torch

    if x_fp8.numel() == 0:
        return x_fp8.to(torch.bfloat16)
    m, n = x_fp8.shape
    padded = torch.nn.functional.pad(x_fp8, (0, align(n, _GROUP) - n))
    if x_scales.dtype == torch.int32:
        x_scales = (x_scales.view(torch.uint8).to(torch.int32) << 23).view(torch.float32)
    values = padded.to(torch.float32).view(m, -1, _GROUP) * x_scales.view(m, -1, 1)
    return values.view(m, -1).to(torch.bfloat16)[:, :n].contiguous()


def inplace_unique(x: Any, num_slots: int) -> None:
    """Each row of `x` ([rows, k], values in [0, num_slots) or -1) becomes its distinct values in
    descending order, then -1s."""
    import torch

    if x.dim() != 2:
        raise ValueError(f"inplace_unique: x must be 2-D, got {tuple(x.shape)}")
    slots = x.masked_fill(x < 0, num_slots)
    counts = torch.zeros((x.size(0), num_slots + 1), dtype=x.dtype, device=x.device)
    counts.scatter_add_(1, slots, torch.ones_like(slots))
    present = torch.arange(num_slots, dtype=x.dtype, device=x.device).expand(x.size(0), num_slots)
    present = present.masked_fill(counts[:, :num_slots] == 0, -1)
    distinct = torch.sort(present, dim=-1, descending=True).values
    x.fill_(-1)
    width = min(num_slots, x.size(1))
    x[:, :width] = distinct[:, :width]


def create_grouped_scores(scores: Any, group_idx: Any, num_groups: int) -> Any:
    """`scores` ([tokens, experts]) with the experts of groups not in `group_idx` zeroed."""
    import torch

    num_tokens, num_experts = scores.shape
    grouped = scores.view(num_tokens, num_groups, -1)
    kept = torch.zeros((num_tokens, num_groups), dtype=torch.bool, device=scores.device)
    kept.scatter_(1, group_idx, True)
    return (grouped * kept.unsqueeze(-1)).view(num_tokens, num_experts)


def hash_tensor(t: Any) -> int:
    """The sum of the tensor's bytes read as int32 words."""
    import torch

    return t.view(torch.int32).sum().item()


def hash_tensors(*tensors: Any) -> int:
    """XOR of hash_tensor over the tensors (nested tuples and lists too; None skipped)."""
    import torch

    value = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            value ^= hash_tensors(*t)
        elif isinstance(t, torch.Tensor):
            value ^= hash_tensor(t)
    return value


def count_bytes(*tensors: Any) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total
