"""What the package does without a GPU (CI): import, configs, size hints, argument errors."""

import importlib.util

import pytest

import epcomm
from epcomm import _C

HAS_TORCH = importlib.util.find_spec("torch") is not None


def gpu_usable() -> bool:
    return _C.cuda_device_count() > 0


def test_import_needs_no_torch_and_reports_a_version():
    assert epcomm.version().startswith(epcomm.__version__)
    for name in ("Buffer", "Config", "EventOverlap"):
        assert hasattr(epcomm, name)


def test_deep_ep_helpers_exist():
    assert epcomm.Buffer.is_sm90_compiled()  # the default build: 90-real;90-virtual
    from epcomm.buffer import _compute_capability

    assert [_compute_capability(a) for a in ("90", "90a-real", "100f-virtual", "80", "native", "")] == [90, 90, 100, 80, 0, 0]
    assert "90" in _C.cuda_architectures()
    config = epcomm.Config(20)  # every argument optional, as deep_ep's
    assert config.num_sms == 20 and config.num_max_nvl_chunked_recv_tokens == epcomm.Config().num_max_nvl_chunked_recv_tokens
    assert epcomm.Config(num_sms=22, num_max_nvl_chunked_send_tokens=6).num_max_nvl_chunked_send_tokens == 6
    if HAS_TORCH:
        import torch

        assert epcomm.topk_idx_t == torch.int64
    with pytest.raises(AttributeError):
        epcomm.no_such_name  # noqa: B018
    for name in ("get_num_rdma_ranks", "get_rdma_rank", "get_root_rdma_rank", "get_local_device_id"):
        assert hasattr(_C.Buffer, name), name  # deep_ep's runtime queries, on Buffer.runtime
    # deep_ep's internode methods, for code that calls them directly: the same calls.
    assert epcomm.Buffer.internode_combine is epcomm.Buffer.combine
    assert "topk_idx_t" in epcomm.__all__


class _RecordingBuffer:
    """Stands in for a Buffer: what its dispatch was called with."""

    def dispatch(self, *args):
        self.args = args
        return "dispatched"


def test_internode_dispatch_takes_deep_eps_argument_orders():
    names = ("x", "handle", "num_tokens_per_rank", "num_tokens_per_rdma_rank", "is_token_in_rank",
             "num_tokens_per_expert", "topk_idx", "topk_weights", "expert_alignment", "num_worst_tokens", "config",
             "previous_event", "async_finish", "allocate_on_comm_stream")
    config = epcomm.Config()
    # deep_ep 2: no num_worst_tokens before config.
    buffer = _RecordingBuffer()
    assert epcomm.Buffer.internode_dispatch(buffer, "x", None, 1, 2, 3, 4, 5, 6, 7, config, "event", True, True) == "dispatched"
    got = dict(zip(names, buffer.args))
    assert got["expert_alignment"] == 7 and got["num_worst_tokens"] == 0 and got["config"] is config
    assert got["previous_event"] == "event" and got["async_finish"] is True and got["allocate_on_comm_stream"] is True
    # deep_ep 1: num_worst_tokens (an int) where config now is, the rest one place later.
    epcomm.Buffer.internode_dispatch(buffer, "x", None, 1, 2, 3, 4, 5, 6, 7, 64, config, "event", True)
    got = dict(zip(names, buffer.args))
    assert got["num_worst_tokens"] == 64 and got["config"] is config and got["previous_event"] == "event"
    assert got["async_finish"] is True and got["allocate_on_comm_stream"] is False
    # By keyword, either way.
    epcomm.Buffer.internode_dispatch(buffer, "x", num_worst_tokens=32, config=config)
    got = dict(zip(names, buffer.args))
    assert got["num_worst_tokens"] == 32 and got["config"] is config


def test_buffer_takes_deep_eps_positional_order():
    import inspect

    parameters = inspect.signature(epcomm.Buffer.__init__).parameters
    positional = [name for name, p in parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    # deep_ep 2's Buffer (deep_ep/buffers/legacy.py); deep_ep 1's use_fabric is keyword-only here.
    assert positional[:11] == ["self", "group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode", "num_qps_per_rank",
                               "allow_nvlink_for_low_latency_mode", "allow_mnnvl", "explicitly_destroy", "enable_shrink",
                               "comm"]
    assert parameters["use_fabric"].kind == inspect.Parameter.KEYWORD_ONLY


class _FakeEvent:
    empty = False

    def __init__(self, log):
        self.log = log

    def current_stream_wait(self):
        self.log.append("wait")


def test_event_overlap_waits_then_runs_its_hook_once():
    log = []
    event = epcomm.EventOverlap(_FakeEvent(log))
    event.register_hook_after_wait(lambda: log.append("hook"))
    with pytest.raises(RuntimeError, match="already registered"):
        event.register_hook_after_wait(lambda: None)
    event.current_stream_wait()
    event.current_stream_wait()
    assert log == ["wait", "hook", "wait"]
    event.current_stream_wait(release_handle=True)
    assert event.event is None
    event.current_stream_wait()  # no event: waits for nothing
    epcomm.EventOverlap().current_stream_wait()


def test_event_overlap_as_a_context_releases_its_event_when_asked():
    log = []
    event = epcomm.EventOverlap(_FakeEvent(log))
    with event:
        log.append("body")
    assert log == ["body", "wait"] and event.event is not None
    with event(release_handle=True) as same:
        assert same is event
    assert log == ["body", "wait", "wait"] and event.event is None
    with event:  # released: nothing to wait for
        pass
    assert log == ["body", "wait", "wait"]


def test_defaults_come_from_cpp():
    import inspect

    defaults = _C.BUFFER_DEFAULTS
    assert defaults["num_qps_per_rank"] == 24 and defaults["wait_timeout_ms"] == 100_000
    assert defaults["emulated_nodes"] == 1
    signature = inspect.signature(epcomm.Buffer.__init__)
    for name in ("num_qps_per_rank", "allow_nvlink_for_low_latency_mode", "preinitialize", "initialize_in_background",
                 "wait_timeout_ms", "emulated_nodes", "ranks_per_node", "num_rail_bytes"):
        assert signature.parameters[name].default == defaults[name], name
    assert signature.parameters["transport"].default == "auto"


def test_emulated_nodes_from_the_environment(monkeypatch):
    from epcomm.buffer import emulated_nodes_from_env

    monkeypatch.delenv("EPCOMM_EMULATED_NODES", raising=False)
    assert emulated_nodes_from_env(1) == 1 and emulated_nodes_from_env(4) == 4
    monkeypatch.setenv("EPCOMM_EMULATED_NODES", "2")
    assert emulated_nodes_from_env(1) == 2  # left at 1: the environment's
    assert emulated_nodes_from_env(4) == 4  # given: the caller's
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("EPCOMM_EMULATED_NODES", bad)
        with pytest.raises(ValueError, match=f"EPCOMM_EMULATED_NODES='{bad}' must be a positive integer"):
            emulated_nodes_from_env(1)


def test_rings_across_nodes_take_twice_the_bytes():
    config = epcomm.Config()
    one_node = config.get_nvl_buffer_size_hint(7168 * 2, 8)
    assert config.get_nvl_buffer_size_hint(7168 * 2, 8, num_nodes=2) >= 2 * one_node - 128
    with pytest.raises(ValueError, match="num_nodes=9 must be in"):
        config.get_nvl_buffer_size_hint(7168 * 2, 8, num_nodes=9)


def test_calls_take_tensors_and_an_allocator_of_the_buffers_device():
    # The calls read torch tensors in the extension (python/src/torch_bridge.hpp): no argument structs.
    for gone in ("DispatchArgs", "CombineArgs", "LowLatencyDispatchArgs", "LowLatencyCombineArgs", "CallOptions"):
        assert not hasattr(_C, gone), gone
    for call in ("dispatch", "combine", "low_latency_dispatch", "low_latency_combine", "get_dispatch_layout"):
        assert "x" in getattr(_C.Buffer, call).__doc__ or "topk_idx" in getattr(_C.Buffer, call).__doc__, call
    _C.Allocator(lambda requests, stream: [])  # device -1: the callable always; no torch needed
    if HAS_TORCH:
        _C.Allocator(lambda requests, stream: [], 0)  # torch.empty on cuda:0's current stream (imports torch now)
    else:
        with pytest.raises(ImportError):
            _C.Allocator(lambda requests, stream: [], 0)


def test_dispatch_and_combine_configs_follow_deep_ep_names():
    config = epcomm.Buffer.get_dispatch_config(8)
    assert config.num_sms == 24
    assert config.num_max_nvl_chunked_send_tokens == 8
    assert config.num_max_nvl_chunked_recv_tokens == 128
    assert epcomm.Buffer.get_combine_config(8).num_sms == 24
    custom = epcomm.Config(20, 6, 256, 6, 128)
    assert custom.num_sms == 20 and custom.num_max_nvl_chunked_recv_tokens == 256
    assert custom.get_nvl_buffer_size_hint(7168 * 2, 8) > 10 * 8 * 256 * 7168 * 2 - 1
    assert custom.get_rdma_buffer_size_hint(7168 * 2, 8) == 0


def test_the_combine_layout_is_named_and_checked():
    config = epcomm.Config()
    assert config.combine_layout == "split"
    config.combine_layout = "colocated"
    assert config.combine_layout == "colocated"
    config.validate()
    with pytest.raises(ValueError, match="combine_layout='fused' must be 'split' or 'colocated'"):
        config.combine_layout = "fused"
    assert config.combine_layout == "colocated"  # a refused value changes nothing


def test_bad_values_raise_value_errors_naming_them():
    config = epcomm.Config(7, 6, 256)
    with pytest.raises(ValueError, match="num_sms=7"):
        config.validate()
    with pytest.raises(ValueError, match="num_sms=7"):
        epcomm.Buffer.set_num_sms(7)
    epcomm.Buffer.get_dispatch_config(16)  # 16 ranks: hierarchical normal mode, two nodes of 8
    epcomm.Buffer.get_dispatch_config(64)  # EP64: eight nodes of 8
    with pytest.raises(RuntimeError, match="num_ranks=65"):
        epcomm.Buffer.get_dispatch_config(65)  # beyond the ranks a Buffer takes: Unsupported


def test_warmup_shape_takes_keywords():
    shape = epcomm.WarmupShape(num_tokens=4096, num_low_latency_tokens=128, hidden=7168, num_topk=8, num_experts=256)
    assert (shape.num_tokens, shape.num_low_latency_tokens, shape.hidden) == (4096, 128, 7168)
    assert epcomm.WarmupShape().num_tokens == 0
    with pytest.raises(TypeError):
        epcomm.WarmupShape(4096, 128, 7168, 8, 256)  # keywords only: five ints are easy to misorder


def test_low_latency_size_hint():
    hint = epcomm.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 256)
    assert hint >= 2 * 32 * 8 * 128 * 7168 * 2
    assert hint % 128 == 0
    with pytest.raises(ValueError, match="num_experts=250"):
        epcomm.Buffer.get_low_latency_rdma_size_hint(128, 7168, 8, 250)


def test_dtype_codes_are_integers_both_ways():
    assert int(_C.DType.bfloat16) == 0 and int(_C.DType.float8_e4m3fn) == 1
    assert _C.DType(4) == _C.DType.int64


def test_bootstrap_checks_its_rank():
    with pytest.raises(ValueError, match="rank=2"):
        _C.Bootstrap(2, 2, lambda data: data, lambda: None)


def test_single_rank_exchange_round_trips_through_python():
    calls = []

    def allgather(data: bytes) -> bytes:
        calls.append(len(data))
        return data

    bootstrap = _C.Bootstrap(0, 1, allgather, lambda: None)
    if gpu_usable():
        pytest.skip("the no-GPU error path needs a machine without a GPU")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        _C.Buffer(bootstrap, num_nvl_bytes=1 << 20)


def test_an_interrupt_in_a_bootstrap_callback_stays_an_interrupt():
    if not gpu_usable():
        pytest.skip("the ranks exchange only after the device opens: needs a GPU")

    def interrupted(data: bytes) -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _C.Buffer(_C.Bootstrap(0, 1, interrupted, lambda: None), num_nvl_bytes=1 << 20)
    # In the background the start keeps its exception and raises it at every call: each time the
    # same KeyboardInterrupt (a python_error raised twice would abort the process).
    background = _C.Buffer(_C.Bootstrap(0, 1, interrupted, lambda: None), num_nvl_bytes=1 << 20,
                           initialize_in_background=True)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            background.barrier(0)

    def failing(data: bytes) -> bytes:
        raise OSError("the store is gone")

    with pytest.raises(RuntimeError, match="the Python allgather failed: .*the store is gone"):
        _C.Buffer(_C.Bootstrap(0, 1, failing, lambda: None), num_nvl_bytes=1 << 20)
    buffer = _C.Buffer(_C.Bootstrap(0, 1, lambda data: data, lambda: None), num_nvl_bytes=1 << 20)
    assert buffer.is_available()  # nothing was left behind
    buffer.destroy()


def test_transport_names_are_checked():
    bootstrap = _C.Bootstrap(0, 1, lambda data: data, lambda: None)
    with pytest.raises(ValueError, match="transport='rdma' must be 'auto', 'ipc' or 'nvshmem'"):
        _C.Buffer(bootstrap, num_nvl_bytes=1 << 20, transport="rdma")


def test_background_initialisation_raises_at_the_first_call():
    if gpu_usable():
        pytest.skip("the no-GPU error path needs a machine without a GPU")
    bootstrap = _C.Bootstrap(0, 1, lambda data: data, lambda: None)
    buffer = _C.Buffer(bootstrap, num_nvl_bytes=1 << 20, initialize_in_background=True)  # returns at once
    with pytest.raises(RuntimeError, match="no CUDA device"):
        buffer.barrier(0)
    assert not buffer.is_available()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (epcomm uses it at run time only)")
def test_tensor_arguments_are_checked_with_their_names():
    import torch

    from epcomm import _torch

    with pytest.raises(ValueError, match="topk_idx must be on a CUDA device"):
        _torch.view(torch.zeros(4, 2, dtype=torch.int64), "topk_idx")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        _torch.view([1, 2, 3], "x")
    assert _torch.view(None, "x").shape == []
    assert _torch.to_torch_dtype(int(_C.DType.bfloat16)) is torch.bfloat16
    assert _torch.to_torch_dtype(_C.DType.float8_e4m3fn) is torch.float8_e4m3fn


def test_utils_has_deep_eps_names():
    from epcomm import utils

    for name in ("Config", "EventHandle", "EventOverlap", "check_nvlink_connections"):
        assert hasattr(utils, name), name
    assert utils.EventOverlap is epcomm.EventOverlap and utils.Config is epcomm.Config
    overlap = utils.EventOverlap()  # deep_ep's default: nothing to wait for
    assert overlap.event is None and overlap.extra_tensors is None


def test_install_as_deep_ep_serves_imports_by_name(monkeypatch):
    import sys

    for name in ("deep_ep", "deep_ep.utils", "deep_ep.utils.envs", "deep_ep.utils.math", "deep_ep.utils.testing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    epcomm.install_as_deep_ep()
    epcomm.install_as_deep_ep()  # twice is harmless
    import deep_ep
    from deep_ep import Buffer
    from deep_ep.utils import EventHandle, EventOverlap
    # What deep_ep's own tests import (tests/legacy/test_*.py), the same modules as epcomm's.
    from deep_ep.utils.envs import init_dist
    from deep_ep.utils.math import calc_diff, hash_tensor, inplace_unique, per_token_cast_back, per_token_cast_to_fp8
    from deep_ep.utils.testing import bench, bench_kineto

    assert deep_ep is epcomm and Buffer is epcomm.Buffer
    assert EventOverlap is epcomm.EventOverlap and EventHandle is epcomm.EventHandle
    from epcomm.utils import envs, math, testing

    assert init_dist is envs.init_dist and calc_diff is math.calc_diff and hash_tensor is math.hash_tensor
    assert inplace_unique is math.inplace_unique and per_token_cast_back is math.per_token_cast_back
    assert per_token_cast_to_fp8 is math.per_token_cast_to_fp8
    assert bench is testing.bench and bench_kineto is testing.bench_kineto


def test_dist_backend_is_gloo_where_ranks_share_gpus(monkeypatch):
    from epcomm.utils.envs import backend_for

    monkeypatch.delenv("EPCOMM_DIST_BACKEND", raising=False)
    assert backend_for(8, 8) == "nccl" and backend_for(2, 1) == "gloo"
    monkeypatch.setenv("EPCOMM_DIST_BACKEND", "gloo")
    assert backend_for(8, 8) == "gloo"


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_deep_eps_test_helpers_on_cpu_tensors():
    import torch

    from epcomm.utils.math import calc_diff, hash_tensors, inplace_unique, per_token_cast_back, per_token_cast_to_fp8

    ranks = torch.tensor([[3, 1, 3, -1], [0, 0, 0, 0], [-1, -1, -1, -1]])
    inplace_unique(ranks, 4)
    assert ranks.tolist() == [[3, 1, -1, -1], [0, -1, -1, -1], [-1, -1, -1, -1]]
    x = torch.randn(5, 300, dtype=torch.bfloat16)  # 300 channels: a partial last group of 128
    x[1, :128] = 0  # an all-zero group: the 1e-4 floor
    data, scales = per_token_cast_to_fp8(x)
    assert data.dtype == torch.float8_e4m3fn and tuple(data.shape) == (5, 300) and tuple(scales.shape) == (5, 3)
    assert calc_diff(per_token_cast_back(data, scales).float(), x.float()) < 1e-3
    assert calc_diff(x, x) == 0.0
    # UE8M0 scales: an int32 word of four exponent bytes stands for four groups' power-of-two scales.
    words = torch.tensor([[127 | (128 << 8) | (126 << 16) | (127 << 24)]], dtype=torch.int32)
    ones = torch.ones(1, 512).to(torch.float8_e4m3fn)
    back = per_token_cast_back(ones, words).float()
    assert back[0, ::128].tolist() == [1.0, 2.0, 0.5, 1.0]
    assert hash_tensors(None, (x, [x, x])) == hash_tensors(x) != 0  # nested, None skipped, XOR'd


def test_install_as_deep_ep_refuses_when_a_real_deep_ep_is_loaded(monkeypatch):
    import sys
    import types

    real = types.ModuleType("deep_ep")
    real.__file__ = "/site-packages/deep_ep/__init__.py"
    monkeypatch.setitem(sys.modules, "deep_ep", real)
    with pytest.raises(ImportError, match="a real deep_ep is imported already"):
        epcomm.install_as_deep_ep()
    assert sys.modules["deep_ep"] is real


def test_the_shim_package_answers_import_deep_ep_in_a_fresh_process():
    """python/deep_ep_shim, on the path of a new interpreter (as deep_ep's spawned ranks are)."""
    import os
    import subprocess
    import sys

    shim = os.path.join(os.path.dirname(__file__), "..", "deep_ep_shim")
    code = ("import deep_ep, epcomm; from deep_ep import Buffer; from deep_ep.utils import EventOverlap; "
            "assert deep_ep is epcomm and Buffer is epcomm.Buffer and EventOverlap is epcomm.EventOverlap; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_buffer_offers_check_errors():
    assert callable(getattr(epcomm.Buffer, "check_errors", None))
    assert hasattr(_C.Buffer, "check_device_errors")


_STAND_IN_TORCH = '''
import sys, types
torch = types.ModuleType("torch")
class Tensor:
    is_cuda = True
    device = "cuda:0"
    def __init__(self, dtype, shape=(4, 2), strides=(2, 1)):
        self.dtype, self.shape, self._strides = dtype, shape, strides
    def stride(self): return self._strides
    def data_ptr(self): return 4096
    def get_device(self): return 0
torch.Tensor = Tensor
torch.empty = lambda *args, **kwargs: None
for name in ("bfloat16", "float8_e4m3fn", "float32", "int32", "int64", "bool", "uint8"):
    setattr(torch, name, type(name, (), {"__repr__": lambda self, name=name: "torch." + name})())
torch._C = types.SimpleNamespace(_cuda_getDevice=lambda: 0, _cuda_getCurrentRawStream=lambda device: 0)
sys.modules["torch"] = torch
from epcomm import _C
view = _C.TensorView.of(Tensor(torch.int64), "topk_idx")
assert (view.data, view.dtype, view.shape) == (4096, int(_C.DType.int64), [4, 2]), view
for bad, kind, words in ((Tensor(object()), ValueError, "x has dtype"), ([1, 2], TypeError, "got list"),
                         (Tensor(torch.bool, (2, 2, 2, 2, 2), (16, 8, 4, 2, 1)), ValueError, "5 dimensions"),
                         (Tensor(torch.bool, (4, 2), (1,)), TypeError, "x.stride() gave"),
                         (Tensor(torch.bool, (), ()), ValueError, "0-dimensional")):
    try:
        _C.TensorView.of(bad, "x")
    except kind as error:
        assert words in str(error), error
    else:
        raise AssertionError(f"no {kind.__name__} for {words}")
print("ok")
'''


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed: the real one is checked by the GPU tests")
def test_tensor_reader_of_the_extension_against_a_stand_in_torch():
    # The extension reads tensors through torch's Python objects (python/src/torch_bridge.hpp), once
    # per process: a stand-in torch module, in a process of its own, checks that reading without torch.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STAND_IN_TORCH], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


_OUT_OF_MEMORY = '''
import sys, types
from epcomm import _C
def allocator_raising(error):
    def allocate(requests, stream):
        raise error
    return _C.Allocator(allocate)
def raised(allocator):
    try:
        allocator._allocate_for_test(_C.DType.bfloat16, 4, 8)
    except Exception as error:
        return error
    raise AssertionError("the allocator's failure was not raised")
# Without torch loaded: MemoryError keeps its kind; any other failure is a RuntimeError.
error = raised(allocator_raising(MemoryError("no more memory")))
assert type(error) is MemoryError and "OutOfMemory" in str(error) and "no more memory" in str(error), repr(error)
error = raised(allocator_raising(KeyError("lost")))
assert type(error) is RuntimeError and "lost" in str(error), repr(error)
# With torch loaded: torch's own out-of-memory error, whichever the allocator raised.
torch = types.ModuleType("torch")
class OutOfMemoryError(RuntimeError):
    pass
torch.cuda = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
sys.modules["torch"] = torch
for cause in (OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError("host")):
    error = raised(allocator_raising(cause))
    assert type(error) is OutOfMemoryError and str(cause) in str(error), repr(error)
print("ok")
'''


def test_an_allocators_out_of_memory_keeps_its_kind():
    # Frameworks catch torch.cuda.OutOfMemoryError (or MemoryError) to retry with less; an
    # allocation failing inside a call must not turn into a plain RuntimeError. In a process of its
    # own, with a stand-in torch (no GPU needed).
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


_STAND_IN_DISTRIBUTED = '''
import sys, types
calls = []
torch = types.ModuleType("torch")
dist = types.ModuleType("torch.distributed")
torch.distributed = dist
torch.cuda = types.SimpleNamespace(current_device=lambda: 0,
                                   Stream=lambda device, priority: types.SimpleNamespace(cuda_stream=0))
dist.get_rank = lambda group=None: 0
dist.get_world_size = lambda group=None: 2
dist.get_process_group_ranks = lambda group: [4, 5]
dist.barrier = lambda group=None: None
dist.destroy_process_group = lambda group=None: calls.append(("destroy", group))
def new_group(ranks, backend=None, use_local_synchronization=False):
    calls.append(("new_group", list(ranks), backend, use_local_synchronization))
    return ("group", tuple(ranks))
dist.new_group = new_group
sys.modules["torch"], sys.modules["torch.distributed"] = torch, dist
import epcomm
from epcomm import buffer as buffer_module

made = []
class Runtime:  # the extension's Buffer, which would need a GPU
    def __init__(self, *args, **kwargs): made.append(kwargs); self.alive = True
    def destroy(self): calls.append(("runtime.destroy",)); self.alive = False
    def is_available(self): return self.alive

real = buffer_module._C
buffer_module._C = types.SimpleNamespace(Buffer=Runtime, Bootstrap=lambda *args: None,
                                         BUFFER_DEFAULTS=real.BUFFER_DEFAULTS)
buffer_module._torch = types.SimpleNamespace(make_allocator=lambda device: None, current_stream=lambda device: 0,
                                             gathered_bytes=lambda *args: None)
# An expert-parallel group's Buffer initialised in the background: its private group is made by its
# own ranks alone (named by them).
buffer = epcomm.Buffer("ep group of ranks 4 and 5", initialize_in_background=True)
assert calls == [("new_group", [4, 5], "gloo", True)], calls
buffer.destroy()
assert calls[1:] == [("runtime.destroy",)], calls  # the group stays: its name must not be reused
# An older torch without the option: the group is still made, the old way.
calls.clear()
dist.new_group = lambda ranks, backend=None: calls.append(("old new_group", list(ranks), backend)) or "old group"
buffer = epcomm.Buffer("ep group", initialize_in_background=True)
assert calls == [("old new_group", [4, 5], "gloo")], calls
# In the foreground the caller's group serves: no group is made.
calls.clear()
kept = epcomm.Buffer("ep group")
assert calls == [], calls
# deep_ep's explicitly_destroy reaches the runtime (whose destructor then waits for no peer).
assert made[-1]["explicitly_destroy"] is False
explicit = epcomm.Buffer("ep group", explicitly_destroy=True)
assert made[-1]["explicitly_destroy"] is True
assert real.BUFFER_DEFAULTS["explicitly_destroy"] is False
# A Buffer let go tears its runtime down then, as deep_ep's does (tensors of its memory may keep
# the runtime object itself longer, differently on each rank); with explicitly_destroy it does not.
del kept
assert calls == [("runtime.destroy",)], calls
calls.clear()
del explicit
assert calls == [], calls
print("ok")
'''


def test_a_background_initialisation_gets_a_group_of_its_own_ranks_alone():
    # Buffer(initialize_in_background=True) makes a private gloo group; torch must name it by its
    # ranks (use_local_synchronization), or the disjoint expert-parallel groups of one world would
    # share rendezvous keys and hang. Checked against stand-in torch modules, in a process of its own.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STAND_IN_DISTRIBUTED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_low_latency_receive_hook_keeps_the_callers_tensors():
    # The extension's hook holds raw pointers to the caller's own tensors that its launch writes
    # (out, the statistics) or reads (the weights); the hook Python returns keeps them, as deep_ep's
    # does, until the hook itself goes. Checked with a stand-in runtime and stand-in tensors.
    import gc
    import weakref

    class Tensor:  # a stand-in: only its lifetime matters here
        pass

    launched = []

    class Runtime:
        def low_latency_combine(self, *args):
            return "combined", None, lambda *stream: launched.append(stream)

        def low_latency_dispatch(self, *args):
            return "recv_x", None, "count", "handle", None, lambda *stream: launched.append(stream)

    buffer = epcomm.Buffer.__new__(epcomm.Buffer)
    buffer.runtime, buffer.allocator = Runtime(), None
    out, weights, stats, topk = Tensor(), Tensor(), Tensor(), Tensor()
    watched = [weakref.ref(tensor) for tensor in (out, weights, stats, topk)]
    _, _, hook = buffer.low_latency_combine(Tensor(), topk, weights, None, return_recv_hook=True, out=out,
                                             combine_wait_recv_cost_stats=stats)
    del out, weights, stats, topk
    gc.collect()
    assert all(ref() is not None for ref in watched), "the hook let go of a tensor its receive uses"
    hook()
    hook(7)  # on another stream, as the extension's hook takes it
    assert launched == [(), (7,)]
    del hook
    gc.collect()
    assert all(ref() is None for ref in watched), "the tensors outlived the hook"

    stats = Tensor()
    watched = weakref.ref(stats)
    _, _, _, _, hook = buffer.low_latency_dispatch(Tensor(), Tensor(), 8, 16, cumulative_local_expert_recv_stats=stats,
                                                   use_fp8=False, return_recv_hook=True)
    del stats
    gc.collect()
    assert watched() is not None
    _, _, no_hook = buffer.low_latency_combine(Tensor(), Tensor(), Tensor(), None)
    assert no_hook is None
