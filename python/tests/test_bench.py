"""python -m epcomm.bench without a GPU: its options, and a clear exit where it cannot run."""

import importlib.util

import pytest

from epcomm import bench

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_defaults_are_the_issue_sizes():
    args = bench.parse_args([])
    assert args.token_counts == [512, 2048, 8192, 16384] and args.ranks == 2 and args.hidden == 7168
    assert args.back_to_back == 0  # each call from an idle stream
    assert bench.parse_args(["--back-to-back", "50"]).back_to_back == 50
    assert args.combine_layout == "split"
    assert bench.parse_args(["--combine-layout", "colocated"]).combine_layout == "colocated"


@pytest.mark.parametrize("argv", [["--tokens", "512,x"], ["--tokens", "0"], ["--ranks", "9"], ["--experts", "255"],
                                  ["--hidden", "100"], ["--back-to-back", "-1"], ["--combine-layout", "fused"]])
def test_bad_options_exit_2_naming_the_option(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(argv)
    assert exit_info.value.code == 2 and argv[0] in capsys.readouterr().err


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed: the no-torch exit does not apply")
def test_without_torch_it_says_so(capsys):
    assert bench.main(["--ranks", "1"]) == 3
    assert "needs torch" in capsys.readouterr().err


def test_ops_take_turns_and_warmup_rounds_are_dropped():
    calls = []
    ops = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    clock = iter(range(100))

    def measure(call):
        call()
        tick = next(clock)
        return float(tick), float(tick) / 2

    samples = bench._in_turns(ops, warmup=1, iters=2, measure=measure)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # one call of each op per round
    assert samples == {"a": [(2.0, 1.0), (4.0, 2.0)], "b": [(3.0, 1.5), (5.0, 2.5)]}


def test_medians_are_of_each_rounds_slowest_rank_as_epcomm_bench_takes_them():
    # Rank 0 slow in round 0, rank 1 in round 1: the slowest rank of each round is (9, 1), (9, 4),
    # (5, 3) -> medians 9 and 3. Each rank's own median, then the larger, gave 5 and 1: lower, by
    # the ranks' skew.
    gathered = [
        [(9.0, 1.0), (1.0, 1.0), (5.0, 3.0)],  # rank 0
        [(1.0, 1.0), (9.0, 4.0), (5.0, 1.0)],  # rank 1
    ]
    assert bench.slowest_rank_medians(gathered) == (9.0, 3.0)


def test_only_what_the_run_checks_says_correct():
    assert bench._CHECKED == {("dispatch", "bf16", False), ("combine", "bf16", False)}
