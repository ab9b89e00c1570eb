"""epcomm from PyTorch on the GPU: N rank processes (torch.multiprocessing) on a gloo group, all on
the visible GPUs (rank r on GPU r % count; several per GPU need MPS). Checked exactly:
  normal:      combine(dispatch(x)) == bf16(k * x), k = ranks the token went to
  low latency: combine(dispatch(x), weights) == bf16(sum_k w_k * x), each product rounded, k ascending
plus async events, hook mode and the deep_ep tuple shapes.
"""

import importlib.util
import os
import socket

import pytest
from low_latency_reference import calc_diff, low_latency_combined

HAS_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def _gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, num_ranks: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    import epcomm

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    group = dist.new_group(list(range(num_ranks)))
    tokens, hidden, topk, experts_per_rank = 64, 2048, 4, 4
    experts = experts_per_rank * num_ranks
    config = epcomm.Buffer.get_dispatch_config(num_ranks)
    config.num_sms = max(2, min(config.num_sms, torch.cuda.get_device_properties(0).multi_processor_count // num_ranks // 2 * 2))
    buffer = epcomm.Buffer(group, num_nvl_bytes=config.get_nvl_buffer_size_hint(hidden * 2, num_ranks),
                           num_rdma_bytes=epcomm.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, num_ranks, experts),
                           low_latency_mode=True, preinitialize=True,
                           warmup_shape=epcomm.WarmupShape(num_tokens=tokens, num_low_latency_tokens=tokens, hidden=hidden,
                                                           num_topk=topk, num_experts=experts))
    generator = torch.Generator(device="cpu").manual_seed(1234 + rank)
    x = torch.randn(tokens, hidden, generator=generator).to(torch.bfloat16).cuda()
    scores = torch.rand(tokens, experts, generator=generator)
    topk_idx = scores.topk(topk, dim=1).indices.to(torch.int64).cuda()
    topk_idx[0] = -1  # a token with no expert
    weights = torch.rand(tokens, topk, generator=generator).cuda()

    # Normal mode, deep_ep's call sequence.
    per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    assert per_rdma_rank is None
    recv_x, recv_idx, recv_weights, counts, handle, event = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=weights, config=config, async_finish=True)
    event.current_stream_wait()
    assert recv_x.shape == (handle.num_rows, hidden) and len(counts) == experts_per_rank
    _check_dispatch_handle(handle, per_rank, in_rank, group, rank, num_ranks)
    cached_x, _, _, _, cached_handle, _ = buffer.dispatch(x, handle=handle, config=config)  # the handle passed back
    assert torch.equal(cached_x, recv_x) and len(cached_handle) == 6
    with pytest.raises(TypeError, match="pass the handle object itself"):
        buffer.combine(recv_x, tuple(handle), config=config)
    combined, combined_weights, _ = buffer.combine(recv_x, handle, config=config)
    copies = in_rank.sum(dim=1, keepdim=True).float()
    expected = (x.float() * copies).to(torch.bfloat16)
    assert torch.equal(combined, expected), f"rank {rank}: normal round trip differs"

    # Low-latency mode, BF16 (exact), with and without the hook.
    for hook_mode in (False, True):
        received, count, ll_handle, _, hook = buffer.low_latency_dispatch(
            x, topk_idx, tokens, experts, use_fp8=False, return_recv_hook=hook_mode)
        if hook_mode:
            hook()
        _check_low_latency_handle(ll_handle, count, topk_idx, group, rank, num_ranks, experts_per_rank, tokens, hidden,
                                  experts)
        out, _, combine_hook = buffer.low_latency_combine(received, topk_idx, weights, ll_handle,
                                                          return_recv_hook=hook_mode)
        if hook_mode:
            combine_hook()
        expected = low_latency_combined(torch, x, weights, topk_idx, experts_per_rank, num_ranks)
        assert torch.equal(out, expected), f"rank {rank}: low-latency round trip differs"
    # use_logfmt (deep_ep's compact combine payload): close to the exact sum by deep_ep's own measure.
    small = x * 0.125  # below 1, so that LogFMT casts
    received, _, ll_handle, _, _ = buffer.low_latency_dispatch(small, topk_idx, tokens, experts, use_fp8=False)
    out, _, _ = buffer.low_latency_combine(received, topk_idx, weights, ll_handle, use_logfmt=True)
    expected = low_latency_combined(torch, small, weights, topk_idx, experts_per_rank, num_ranks)
    diff = calc_diff(out, expected)
    assert not out.isnan().any() and diff < 1e-5, f"rank {rank}: use_logfmt calc_diff {diff:.3g}"
    _check_fp8_low_latency(buffer, x, topk_idx, group, rank, num_ranks, tokens, experts)
    torch.cuda.synchronize()

    # deep_ep's raw views of the buffers (read only here: the calls own that memory).
    raw = buffer.get_local_buffer_tensor(torch.bfloat16, (16, 8), offset=256)
    assert raw.shape == (16, 8) and raw.dtype == torch.bfloat16 and raw.is_cuda
    region = buffer.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    assert region.numel() == buffer.num_rdma_bytes
    assert buffer.runtime.get_num_rdma_ranks() == 1 and buffer.runtime.get_local_device_id() == x.device.index
    buffer.destroy()
    dist.destroy_process_group()


def _gathered(tensor, group, num_ranks):
    """Every rank's copy of `tensor`, stacked (gloo: through the CPU)."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(tensor.cpu()) for _ in range(num_ranks)]
    dist.all_gather(parts, tensor.cpu().contiguous(), group=group)
    return torch.stack(parts)


def _check_dispatch_handle(handle, per_rank, in_rank, group, rank: int, num_ranks: int) -> None:
    """The handle reads as deep_ep's tuple, with its entries' meanings."""
    import torch

    assert len(handle) == 6
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head = handle
    sent = _gathered(per_rank, group, num_ranks)  # [source, destination]
    assert torch.equal(rank_prefix.cpu(), sent.cumsum(dim=0).to(torch.int32)), f"rank {rank}: rank_prefix_matrix"
    assert torch.equal(handle[0], rank_prefix) and handle[-1] is send_head
    # deep_ep's check_data: rows from source i are recv_x[prefix[i - 1][rank]:prefix[i][rank]].
    starts = [0] + rank_prefix[:, rank].tolist()
    channels = handle.num_channels
    assert channel_prefix.shape == (num_ranks, channels) and recv_channel_prefix.shape == (num_ranks, channels)
    assert torch.equal(channel_prefix[:, -1].cpu(), per_rank.cpu()), f"rank {rank}: channel_prefix_matrix totals"
    assert recv_channel_prefix[:, 0].tolist() == starts[:-1], f"rank {rank}: recv_channel_prefix_matrix"
    assert recv_src_idx.shape == (starts[-1],) and torch.equal(is_token_in_rank, in_rank)
    assert torch.equal(send_head >= 0, in_rank), f"rank {rank}: send_head marks exactly the tokens sent"
    for source in range(num_ranks):  # each source's rows arrive in its token order
        rows = recv_src_idx[starts[source]:starts[source + 1]]
        assert bool((rows[1:] > rows[:-1]).all()), f"rank {rank}: rows from {source} out of order"


def _check_low_latency_handle(handle, count, topk_idx, group, rank: int, num_ranks: int, experts_per_rank: int,
                              tokens: int, hidden: int, experts: int) -> None:
    """deep_ep's low-latency handle: (src_info, layout_range, max_tokens, hidden, experts)."""
    import torch

    src_info, layout_range, max_tokens, handle_hidden, handle_experts = handle
    assert (max_tokens, handle_hidden, handle_experts) == (tokens, hidden, experts) and len(handle) == 5
    everyone = _gathered(topk_idx, group, num_ranks)  # [source, token, k]
    mask = (1 << 32) - 1
    for local in range(experts_per_rank):
        expert = rank * experts_per_rank + local
        ranges = layout_range[local].cpu()
        assert int(count[local]) == int((ranges & mask).sum()), f"rank {rank}: expert {local} count"
        begin = 0
        for source in range(num_ranks):  # packed in source order: begin, count per source
            rows = int(ranges[source] & mask)
            assert int(ranges[source] >> 32) == begin and rows == int((everyone[source] == expert).any(dim=1).sum())
            got = src_info[local, begin:begin + rows].cpu()
            want = (everyone[source] == expert).any(dim=1).nonzero().flatten().to(torch.int32)
            assert torch.equal(got, want), f"rank {rank}: expert {local}, source {source}: src_info"
            begin += rows


def _check_fp8_low_latency(buffer, x, topk_idx, group, rank: int, num_ranks: int, tokens: int, experts: int) -> None:
    """FP8 low-latency dispatch: scales in deep_ep's layout ([E_local, R*M, hidden/128], stride 1
    along the rows), rows that dequantise back to the sources' tokens, and the cycles waited per
    source counted (dispatch_wait_recv_cost_stats)."""
    import torch

    waited = torch.zeros(num_ranks, dtype=torch.int64, device=x.device)
    (recv_x, scales), count, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=True,
                                                                        dispatch_wait_recv_cost_stats=waited)
    torch.cuda.synchronize()
    assert bool((waited > 0).all()), f"rank {rank}: dispatch_wait_recv_cost_stats {waited.tolist()}"
    local_experts, rows, hidden = recv_x.shape
    assert scales.shape == (local_experts, rows, hidden // 128) and scales.stride() == (hidden // 128 * rows, 1, rows)
    everyone = _gathered(x, group, num_ranks).float()  # [source, token, hidden]
    src_info, layout_range = handle[0], handle[1]
    for local in range(local_experts):
        used = int(count[local])
        dequantised = recv_x[local, :used].float().view(used, -1, 128) * scales[local, :used].unsqueeze(-1)
        sources = torch.repeat_interleave(torch.arange(num_ranks), (layout_range[local].cpu() & ((1 << 32) - 1)))
        original = everyone[sources, src_info[local, :used].cpu().long()]
        error = (dequantised.view(used, hidden).cpu() - original).abs().max().item() if used else 0.0
        assert error <= 0.07 * everyone.abs().max().item(), f"rank {rank}: expert {local}: FP8 rows off by {error}"


def _mps_active() -> bool:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipe, "control"))


def _spawn(main, num_ranks: int) -> None:
    """Runs main(rank, num_ranks, port) in num_ranks processes, or skips saying why it cannot."""
    if not _gpu_available():
        pytest.skip("no CUDA GPU")
    import torch

    if num_ranks > torch.cuda.device_count() and not _mps_active():
        pytest.skip(f"{num_ranks} ranks on {torch.cuda.device_count()} GPU(s) need MPS to run at the same time")
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(main, args=(num_ranks, _free_port()), nprocs=num_ranks, join=True)


@pytest.mark.parametrize("num_ranks", [1, 2, 4])
def test_round_trips(num_ranks: int) -> None:
    _spawn(_rank_main, num_ranks)


def _shrink_main(rank: int, num_ranks: int, port: int) -> None:
    """deep_ep's shrink mode: every rank but the last masks the last one, which masks the others;
    the others' low-latency round leaves it out (its experts add nothing), the mask reads back and
    cleans, and a round with everyone is exact again."""
    import torch
    import torch.distributed as dist

    import epcomm

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    tokens, hidden, topk, experts_per_rank = 32, 1024, 4, 4
    experts = experts_per_rank * num_ranks
    buffer = epcomm.Buffer(dist.group.WORLD, low_latency_mode=True, enable_shrink=True,
                           num_rdma_bytes=epcomm.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, num_ranks, experts))
    generator = torch.Generator(device="cpu").manual_seed(4321 + rank)
    x = (torch.randn(tokens, hidden, generator=generator) * 0.125).to(torch.bfloat16).cuda()
    topk_idx = torch.rand(tokens, experts, generator=generator).topk(topk, dim=1).indices.to(torch.int64).cuda()
    weights = torch.rand(tokens, topk, generator=generator).cuda()
    last = num_ranks - 1
    status = torch.empty(num_ranks, dtype=torch.int32, device="cuda")

    def round_trip():
        received, _, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=False)
        out, _, _ = buffer.low_latency_combine(received, topk_idx, weights, handle)
        torch.cuda.synchronize()
        return out

    if num_ranks > 1:
        masked = [r for r in range(num_ranks) if r != rank] if rank == last else [last]
        for r in masked:
            buffer.low_latency_update_mask_buffer(r, True)
        buffer.low_latency_query_mask_buffer(status)
        expected_mask = torch.zeros(num_ranks, dtype=torch.int32)
        expected_mask[masked] = 1
        assert torch.equal(status.cpu(), expected_mask), f"rank {rank}: mask {status.tolist()}"
        out = round_trip()
        if rank != last:
            kept = torch.where((topk_idx // experts_per_rank) == last, -1, topk_idx)
            expected = low_latency_combined(torch, x, weights, kept, experts_per_rank, num_ranks)
            assert torch.equal(out, expected), f"rank {rank}: the round without the masked rank differs"
        buffer.low_latency_clean_mask_buffer()
        buffer.low_latency_query_mask_buffer(status)
        assert int(status.abs().sum()) == 0, f"rank {rank}: mask after clean {status.tolist()}"
    with pytest.raises(ValueError, match="rank_to_mask"):
        buffer.low_latency_update_mask_buffer(num_ranks, True)
    expected = low_latency_combined(torch, x, weights, topk_idx, experts_per_rank, num_ranks)
    assert torch.equal(round_trip(), expected), f"rank {rank}: the round with every rank differs"
    buffer.destroy()
    dist.destroy_process_group()


@pytest.mark.parametrize("num_ranks", [1, 2, 4])
def test_shrink_mode_leaves_masked_ranks_out(num_ranks: int) -> None:
    _spawn(_shrink_main, num_ranks)


def _hierarchical_main(rank: int, num_ranks: int, port: int, low_latency: bool = False) -> None:
    """Normal mode across two emulated nodes, hierarchical (num_rdma_bytes without low-latency mode,
    or with it: the rail rings then take num_rdma_bytes again, beside the low-latency region),
    through deep_ep's calls: the layout's tokens per node, rows in deep_ep's order (by source rank,
    then token) as its internode handle's recv_gbl_rank_prefix_sum says, and combine(dispatch(x)) == k x exactly
    (rows of small dyadic values, so that the node's sum and the nodes' sum round to nothing). With
    low-latency mode, a low-latency round trip between two normal ones, with no clean between."""
    import torch
    import torch.distributed as dist

    import epcomm

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    tokens, hidden, topk, experts_per_rank, nodes = 48, 1024, 4, 4, 2
    experts = experts_per_rank * num_ranks
    config = epcomm.Buffer.get_dispatch_config(num_ranks)
    config.num_sms = max(2, min(config.num_sms, torch.cuda.get_device_properties(0).multi_processor_count // num_ranks // 2 * 2))
    rdma_bytes = config.rdma_buffer_size_hint(hidden * 2, nodes)
    if low_latency:  # deep_ep's callers size one num_rdma_bytes for both modes
        rdma_bytes = max(rdma_bytes, epcomm.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, num_ranks, experts))
    buffer = epcomm.Buffer(dist.group.WORLD, num_nvl_bytes=config.get_nvl_buffer_size_hint(hidden * 2, num_ranks // nodes),
                           num_rdma_bytes=rdma_bytes, low_latency_mode=low_latency, emulated_nodes=nodes)
    assert buffer.runtime.get_num_rdma_ranks() == nodes
    # deep_ep's RDMA buffer: the low-latency region, or without low-latency mode the rail rings.
    region = buffer.get_local_buffer_tensor(torch.uint8, use_rdma_buffer=True)
    assert region.numel() == rdma_bytes and region[-1].item() >= 0
    generator = torch.Generator(device="cpu").manual_seed(777 + rank)
    x = (torch.randint(-8, 9, (tokens, hidden), generator=generator).float() / 4).to(torch.bfloat16).cuda()
    topk_idx = torch.rand(tokens, experts, generator=generator).topk(topk, dim=1).indices.to(torch.int64).cuda()
    topk_idx[0] = -1  # a token with no expert

    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    reaches_node = in_rank.view(tokens, nodes, num_ranks // nodes).any(dim=2)
    assert per_node is not None and torch.equal(per_node.cpu(), reaches_node.sum(dim=0).int().cpu()), \
        f"rank {rank}: num_tokens_per_rdma_rank {per_node}"
    recv_x, _, _, counts, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, config=config)
    assert len(counts) == experts_per_rank and sum(counts) >= 0
    cached_x, _, _, _, _, _ = buffer.dispatch(x, handle=handle, config=config)
    assert torch.equal(cached_x, recv_x), f"rank {rank}: cached hierarchical dispatch differs"
    # deep_ep's internode handle, and its order (test_internode's check_data): rows by source rank,
    # then token; recv_gbl_rank_prefix_sum (handle[-4]) bounds each source's.
    assert isinstance(handle, epcomm.InternodeDispatchHandle) and len(handle) == 10 and handle[0] is in_rank
    everyone = [torch.empty_like(in_rank, device="cpu") for _ in range(num_ranks)]
    dist.all_gather(everyone, in_rank.cpu())
    marked = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    marked[:, 0] = rank
    marked[:, 1] = torch.arange(tokens, device="cuda").to(torch.bfloat16)
    marked_x, _, _, _, _, _ = buffer.dispatch(marked, handle=handle, config=config)
    bounds = [0] + handle[-4].tolist()
    assert bounds[-1] == marked_x.size(0), f"rank {rank}: recv_gbl_rank_prefix_sum {bounds[1:]}"
    for source in range(num_ranks):
        rows = marked_x[bounds[source]:bounds[source + 1]].float().cpu()
        want = everyone[source][:, rank].nonzero().flatten().float()
        assert (rows[:, 0] == source).all() and torch.equal(rows[:, 1], want), \
            f"rank {rank}: rows from rank {source} are {rows[:, :2].tolist()}, want tokens {want.tolist()}"
    combined, _, _ = buffer.combine(recv_x, handle, config=config)
    expected = (x.float() * in_rank.sum(dim=1, keepdim=True).float()).to(torch.bfloat16)
    assert torch.equal(combined, expected), f"rank {rank}: hierarchical round trip differs"
    # Without top-k (deep_ep's test_internode does it): routed by is_token_in_rank, the same rows.
    plain_x, plain_idx, plain_weights, plain_counts, plain_handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, config=config)
    assert plain_idx is None and plain_weights is None and plain_counts == counts, f"rank {rank}: {plain_counts}"
    assert torch.equal(plain_x, recv_x), f"rank {rank}: hierarchical dispatch without top-k differs"
    plain_combined, plain_combined_weights, _ = buffer.combine(plain_x, plain_handle, config=config)
    assert plain_combined_weights is None and torch.equal(plain_combined, expected), \
        f"rank {rank}: hierarchical round trip without top-k differs"
    if low_latency:
        weights = torch.rand(tokens, topk, generator=generator).cuda()
        received, _, ll_handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=False)
        out, _, _ = buffer.low_latency_combine(received, topk_idx, weights, ll_handle)
        ll_expected = low_latency_combined(torch, x, weights, topk_idx, experts_per_rank, num_ranks)
        assert torch.equal(out, ll_expected), f"rank {rank}: low-latency round trip beside the rail rings differs"
        again, _, _, _, handle, _ = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_node, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, config=config)
        assert torch.equal(again, recv_x), f"rank {rank}: hierarchical dispatch after low-latency calls differs"
    buffer.destroy()
    dist.destroy_process_group()


def _hierarchical_low_latency_main(rank: int, num_ranks: int, port: int) -> None:
    _hierarchical_main(rank, num_ranks, port, low_latency=True)


@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("low_latency", [False, True])
def test_hierarchical_round_trip_across_emulated_nodes(num_ranks: int, low_latency: bool) -> None:
    _spawn(_hierarchical_low_latency_main if low_latency else _hierarchical_main, num_ranks)


def _other_device_current_main(rank: int, num_ranks: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    import epcomm

    torch.cuda.set_device(1)  # the Buffer's device
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    tokens, hidden, topk, experts = 32, 1024, 2, 4
    buffer = epcomm.Buffer(dist.new_group([0]), num_nvl_bytes=1 << 26)
    x = torch.randn(tokens, hidden, device="cuda:1").to(torch.bfloat16)
    topk_idx = torch.randint(0, experts, (tokens, topk), device="cuda:1")
    weights = torch.rand(tokens, topk, device="cuda:1")
    torch.cuda.set_device(0)  # another device current in torch: the calls still run on cuda:1's stream
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    recv_x, _, recv_weights, _, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=weights)
    assert recv_x.device == torch.device("cuda:1")
    combined, _, event = buffer.combine(recv_x, handle, async_finish=True)
    event.current_stream_wait()  # cuda:1's current stream waits (its event names the Buffer's device)
    # One rank: each token comes back once per distinct expert rank, here the one rank: x itself.
    assert torch.equal(combined, x)
    buffer.destroy()
    dist.destroy_process_group()


def test_calls_run_on_the_buffers_device_whatever_device_is_current() -> None:
    if not _gpu_available():
        pytest.skip("no CUDA GPU")
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two visible GPUs (the Buffer on one, the other current)")
    _spawn(_other_device_current_main, 1)
