"""One MoE layer with epcomm, checked against the same layer computed on a single GPU.

    python examples/moe_layer.py --ranks 2

Every rank routes its tokens to the top-k of E experts, dispatches them to the ranks that own
those experts, runs its local experts (one matrix each), and combines the results back. The
answer must match sum_k weight_k * (x @ W_expert_k) computed without any communication.
Ranks run as processes on the visible GPUs (rank r on GPU r % count; several ranks on one GPU
need MPS to run at the same time).
"""

import argparse
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import epcomm  # drop-in for `import deep_ep`: same Buffer API

TOKENS, HIDDEN, EXPERTS_PER_RANK, TOPK = 256, 1024, 4, 2


def moe_layer(rank: int, num_ranks: int, port: int) -> None:
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=num_ranks)
    experts = EXPERTS_PER_RANK * num_ranks
    # Every rank knows every expert's weights (same seed), so it can compute the reference itself.
    weights_of = torch.randn(experts, HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(0)).div(HIDDEN ** 0.5)
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(100 + rank)).cuda()
    router = torch.randn(TOKENS, experts, generator=torch.Generator().manual_seed(200 + rank)).cuda()
    topk_weights, topk_idx = router.softmax(dim=1).topk(TOPK, dim=1)

    config = epcomm.Buffer.get_dispatch_config(num_ranks)
    # Ranks sharing a GPU (MPS) must all fit on it at once: a share of its SMs each.
    sharing = max(1, num_ranks // torch.cuda.device_count())
    config.num_sms = max(2, min(config.num_sms, torch.cuda.get_device_properties(0).multi_processor_count // sharing // 2 * 2))
    # preinitialize + warmup_shape: every one-time cost (and torch's output memory) paid here.
    buffer = epcomm.Buffer(dist.group.WORLD, num_nvl_bytes=config.get_nvl_buffer_size_hint(HIDDEN * 2, num_ranks),
                           preinitialize=True,
                           warmup_shape=epcomm.WarmupShape(num_tokens=TOKENS, hidden=HIDDEN, num_topk=TOPK,
                                                           num_experts=experts))

    # 1. Where does every token go?
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    # 2. Send each token (BF16) once to every rank owning one of its experts.
    recv_x, recv_idx, recv_weights, _, handle, _ = buffer.dispatch(
        x.to(torch.bfloat16), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights.float(), config=config)
    # 3. Local experts: each received row, through each of its local experts, weighted.
    out = torch.zeros(recv_x.shape[0], HIDDEN, device=recv_x.device)
    for local in range(EXPERTS_PER_RANK):
        weight = weights_of[rank * EXPERTS_PER_RANK + local].cuda()
        picked = (recv_idx == local)                      # [rows, topk]: rows that chose this expert
        rows = picked.any(dim=1)
        scale = (recv_weights * picked).sum(dim=1, keepdim=True)[rows]
        out[rows] += scale * (recv_x[rows].float() @ weight)
    # 4. Send results back; each token's rows are summed over the ranks it visited.
    combined, _, _ = buffer.combine(out.to(torch.bfloat16), handle, config=config)

    # The same layer without communication.
    expected = torch.zeros(TOKENS, HIDDEN, device=x.device)
    for k in range(TOPK):
        for expert in range(experts):
            chosen = topk_idx[:, k] == expert
            expected[chosen] += topk_weights[chosen, k:k + 1] * (
                x[chosen].to(torch.bfloat16).float() @ weights_of[expert].cuda())
    error = (combined.float() - expected).norm() / expected.norm()
    print(f"rank {rank}: relative error {error:.2e} (BF16 rounding is about 1e-2)")
    assert error < 2e-2
    buffer.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    arguments = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    mp.spawn(moe_layer, args=(arguments.ranks, free_port), nprocs=arguments.ranks, join=True)
