"""epcomm in MoE-shaped PyTorch code on the GPU, ranks as spawned processes on a gloo group:
  - two MoE layers (normal mode, then low-latency mode), each dispatch -> one matmul per local
    expert -> combine, against the same two layers computed on one GPU without communication;
  - low-latency dispatch + combine captured in a CUDA graph and replayed with new inputs, exact.
"""

import importlib.util
import os
import socket

import pytest
from low_latency_reference import low_latency_combined

HAS_TORCH = importlib.util.find_spec("torch") is not None
pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")

TOKENS, HIDDEN, EXPERTS_PER_RANK, TOPK = 96, 512, 2, 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_rank(rank: int, num_ranks: int, port: int):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    return torch, dist


def _routing(torch, experts: int, seed: int):
    """Top-k experts and softmax weights of every token; ranks seed differently."""
    scores = torch.randn(TOKENS, experts, generator=torch.Generator().manual_seed(seed)).cuda()
    weights, idx = scores.softmax(dim=1).topk(TOPK, dim=1)
    return weights.float().contiguous(), idx.contiguous()


def _reference_layer(torch, x, weights, idx, expert_weights):
    """sum_k weight_k * (bf16(x) @ W_{idx_k}), in float, on this GPU alone."""
    out = torch.zeros(x.shape[0], HIDDEN, device=x.device)
    for k in range(TOPK):
        for expert, matrix in enumerate(expert_weights):
            chosen = idx[:, k] == expert
            out[chosen] += weights[chosen, k:k + 1] * (x[chosen].to(torch.bfloat16).float() @ matrix)
    return out


def _two_layers_main(rank: int, num_ranks: int, port: int) -> None:
    torch, dist = _start_rank(rank, num_ranks, port)
    import epcomm

    experts = EXPERTS_PER_RANK * num_ranks
    # Every rank knows every expert (same seed), so it computes the reference itself.
    make = torch.Generator().manual_seed(7)
    first = [(torch.randn(HIDDEN, HIDDEN, generator=make) / HIDDEN ** 0.5).cuda() for _ in range(experts)]
    second = [(torch.randn(HIDDEN, HIDDEN, generator=make) / HIDDEN ** 0.5).cuda() for _ in range(experts)]
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 + rank)).cuda()
    weights1, idx1 = _routing(torch, experts, 200 + rank)
    weights2, idx2 = _routing(torch, experts, 300 + rank)

    config = epcomm.Buffer.get_dispatch_config(num_ranks)
    sharing = max(1, num_ranks // torch.cuda.device_count())
    config.num_sms = max(2, min(config.num_sms, torch.cuda.get_device_properties(0).multi_processor_count // sharing // 2 * 2))
    buffer = epcomm.Buffer(dist.group.WORLD, num_nvl_bytes=config.get_nvl_buffer_size_hint(HIDDEN * 2, num_ranks),
                           num_rdma_bytes=epcomm.Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, num_ranks, experts),
                           low_latency_mode=True, preinitialize=True)

    # Layer 1, normal mode: each received row through each of its local experts, weighted.
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx1, experts)
    recv_x, recv_idx, recv_weights, _, handle, _ = buffer.dispatch(
        x.to(torch.bfloat16), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx1, topk_weights=weights1, config=config)
    expert_out = torch.zeros(recv_x.shape[0], HIDDEN, device=x.device)
    for local in range(EXPERTS_PER_RANK):
        picked = recv_idx == local
        rows = picked.any(dim=1)
        scale = (recv_weights * picked).sum(dim=1, keepdim=True)[rows]
        expert_out[rows] += scale * (recv_x[rows].float() @ first[rank * EXPERTS_PER_RANK + local])
    hidden_states, _, _ = buffer.combine(expert_out.to(torch.bfloat16), handle, config=config)

    # Layer 2, low-latency mode: rows [0, count) of each local expert are its tokens (packed).
    received, count, ll_handle, _, _ = buffer.low_latency_dispatch(hidden_states, idx2, TOKENS, experts, use_fp8=False)
    ll_out = torch.zeros_like(received)
    for local in range(EXPERTS_PER_RANK):
        n = int(count[local])
        ll_out[local, :n] = (received[local, :n].float() @ second[rank * EXPERTS_PER_RANK + local]).to(torch.bfloat16)
    y, _, _ = buffer.low_latency_combine(ll_out, idx2, weights2, ll_handle)

    expected_hidden = _reference_layer(torch, x, weights1, idx1, first).to(torch.bfloat16)
    expected = _reference_layer(torch, expected_hidden, weights2, idx2, second)
    error = ((y.float() - expected).norm() / expected.norm()).item()
    assert error < 3e-2, f"rank {rank}: two-layer relative error {error:.3e}"
    torch.cuda.synchronize()
    buffer.destroy()
    dist.destroy_process_group()


def _graph_main(rank: int, num_ranks: int, port: int) -> None:
    torch, dist = _start_rank(rank, num_ranks, port)
    import epcomm

    experts = EXPERTS_PER_RANK * num_ranks
    buffer = epcomm.Buffer(dist.group.WORLD,
                           num_rdma_bytes=epcomm.Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, num_ranks, experts),
                           low_latency_mode=True, preinitialize=True)
    static_x = torch.zeros(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
    static_weights, static_idx = _routing(torch, experts, 400 + rank)

    def round_trip():
        received, _, handle, _, _ = buffer.low_latency_dispatch(static_x, static_idx, TOKENS, experts, use_fp8=False)
        out, _, _ = buffer.low_latency_combine(received, static_idx, static_weights, handle)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # outputs allocated once before capture, as torch recommends
        round_trip()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static_out = round_trip()

    for replay in range(5):
        generator = torch.Generator().manual_seed(1000 * replay + rank)
        static_x.copy_(torch.randn(TOKENS, HIDDEN, generator=generator).to(torch.bfloat16))
        weights, idx = _routing(torch, experts, 500 + 1000 * replay + rank)
        static_weights.copy_(weights)
        static_idx.copy_(idx)
        dist.barrier()  # every rank's new inputs are in place before any rank replays
        graph.replay()
        torch.cuda.synchronize()
        expected = low_latency_combined(torch, static_x, static_weights, static_idx, EXPERTS_PER_RANK, num_ranks)
        assert torch.equal(static_out, expected), f"rank {rank}: replay {replay} differs"
    buffer.destroy()
    dist.destroy_process_group()


def _spawn(main, num_ranks: int) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if num_ranks > torch.cuda.device_count() and not os.path.exists(os.path.join(pipe, "control")):
        pytest.skip(f"{num_ranks} ranks on {torch.cuda.device_count()} GPU(s) need MPS to run at the same time")
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(main, args=(num_ranks, _free_port()), nprocs=num_ranks, join=True)


@pytest.mark.parametrize("num_ranks", [1, 2, 4])
def test_two_moe_layers_match_one_gpu(num_ranks: int) -> None:
    _spawn(_two_layers_main, num_ranks)


@pytest.mark.parametrize("num_ranks", [1, 2])
def test_low_latency_round_trip_replays_in_a_cuda_graph(num_ranks: int) -> None:
    _spawn(_graph_main, num_ranks)
