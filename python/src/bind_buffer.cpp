// Bindings of Buffer and the types its calls take. The calls take torch tensors, read through the
// TorchBridge (a data pointer, dtype, shape and strides); outputs come from a PythonAllocator
// (torch.empty) and go back as the torch tensors it made. Every Buffer call releases the GIL:
// calls wait on the GPU and on other ranks.
#include <algorithm>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/constants.hpp"
#include "epcomm/buffer.hpp"
#include "epcomm/error.hpp"
#include "python_allocator.hpp"
#include "transport/topology.hpp"
#include "python_bootstrap.hpp"
#include "torch_bridge.hpp"

namespace nb = nanobind;

namespace epcomm::python {
namespace {

cudaStream_t as_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  using Code = nb::dlpack::dtype_code;
  switch (dtype) {
    case DType::kBFloat16: return {static_cast<uint8_t>(Code::Bfloat), 16, 1};
    case DType::kFloat8E4M3: return {static_cast<uint8_t>(Code::Float8_E4M3FN), 8, 1};
    case DType::kFloat32: return nb::dtype<float>();
    case DType::kInt32: return nb::dtype<int32_t>();
    case DType::kInt64: return nb::dtype<int64_t>();
    case DType::kBool: return nb::dtype<bool>();
    case DType::kUInt8: return nb::dtype<uint8_t>();
  }
  fail(ErrorCode::kInternal, "no DLPack dtype for ", dtype_name(dtype));
}

// A torch tensor over device memory the runtime owns (through DLPack, no copy), keeping `owner`
// (the Python object holding that memory, e.g. a handle) alive for as long as the tensor lives.
// An empty view gives None.
nb::object device_tensor(nb::handle owner, const TensorView& view) {
  if (view.ndim == 0 || (view.data == nullptr && view.numel() > 0)) return nb::none();  // absent
  cudaPointerAttributes attributes{};
  int device = 0;
  if (view.data != nullptr && cudaPointerGetAttributes(&attributes, view.data) == cudaSuccess) {
    device = attributes.device;
  } else {
    (void)cudaGetLastError();
    const cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) fail(ErrorCode::kCudaError, "cudaGetDevice: ", cudaGetErrorString(status));
  }
  size_t shape[TensorView::kMaxDims];
  for (int d = 0; d < view.ndim; ++d) shape[d] = static_cast<size_t>(view.shape[d]);
  return nb::cast(nb::ndarray<nb::pytorch, nb::device::cuda>(view.data, static_cast<size_t>(view.ndim), shape, owner,
                                                            view.strides, dlpack_dtype(view.dtype),
                                                            nb::device::cuda::value, device));
}

TensorView make_view(uintptr_t data, int dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (shape.size() != strides.size() || shape.size() > static_cast<size_t>(TensorView::kMaxDims)) {
    fail(ErrorCode::kInvalidArgument, "TensorView: ", shape.size(), " extents and ", strides.size(),
         " strides given; they must match and be at most ", TensorView::kMaxDims);
  }
  TensorView view;
  view.data = reinterpret_cast<void*>(data);
  view.dtype = static_cast<DType>(dtype);
  view.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    view.shape[d] = shape[d];
    view.strides[d] = strides[d];
  }
  return view;
}

// Runs one of the Buffer's calls without the GIL (it may wait on the GPU, on other ranks, or on a
// background initialisation that calls into Python), returning its result.
template <typename Call>
auto without_gil(Call&& call) {
  nb::gil_scoped_release release;
  return call();
}

// The options of a call made on torch's current stream of the Buffer's device (deep_ep's calls all
// are), which is not always the device current in torch. b.device() may wait for a background
// initialisation, whose Python bootstrap needs the GIL.
CallOptions on_current_stream(const TorchBridge& torch, const Buffer& b, const Event& previous_event, bool async_finish,
                              bool allocate_on_comm_stream) {
  CallOptions call;
  call.stream = torch.current_stream(without_gil([&] { return b.device(); }));
  call.previous_event = previous_event;
  call.async_finish = async_finish;
  call.allocate_on_comm_stream = allocate_on_comm_stream;
  return call;
}

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "DType", nb::is_arithmetic())
      .value("bfloat16", DType::kBFloat16)
      .value("float8_e4m3fn", DType::kFloat8E4M3)
      .value("float32", DType::kFloat32)
      .value("int32", DType::kInt32)
      .value("int64", DType::kInt64)
      .value("bool", DType::kBool)
      .value("uint8", DType::kUInt8);
  nb::class_<TensorView>(m, "TensorView", "A view of device memory: data pointer, dtype, shape, strides (elements).")
      .def(nb::init<>())
      .def_static("make", &make_view, nb::arg("data"), nb::arg("dtype"), nb::arg("shape"), nb::arg("strides"))
      .def_static("of",
                  [](nb::handle tensor, const char* name) {
                    return tensor.is_none() ? TensorView{} : TorchBridge::get().view(tensor, name);  // None: no torch needed
                  },
                  nb::arg("tensor").none(), nb::arg("name"),
                  "A view of a CUDA torch tensor (None: an empty view); errors name the argument `name`.")
      .def_prop_ro("data", [](const TensorView& v) { return reinterpret_cast<uintptr_t>(v.data); })
      .def_prop_ro("shape", [](const TensorView& v) { return std::vector<int64_t>(v.shape, v.shape + v.ndim); })
      .def_prop_ro("dtype", [](const TensorView& v) { return static_cast<int>(v.dtype); })
      .def("__repr__", &TensorView::describe);
  nb::class_<Event>(m, "Event")
      .def(nb::init<>())
      .def_static("record", [](uintptr_t stream) { return Event::record(as_stream(stream)); })
      .def("wait", [](const Event& e, uintptr_t stream) { e.wait(as_stream(stream)); })
      // deep_ep's EventHandle.current_stream_wait: torch's current stream waits for it.
      .def("current_stream_wait", [](const Event& e) { e.wait(TorchBridge::get().current_stream()); })
      .def("synchronize", &Event::synchronize, nb::call_guard<nb::gil_scoped_release>())
      .def("query", &Event::query)
      .def_prop_ro("empty", &Event::empty);
  // Every argument optional, as deep_ep's; the defaults are epcomm's (default_dispatch_config).
  const Config defaults;
  nb::class_<Config>(m, "Config")
      .def("__init__",
           [](Config* self, int num_sms, int nvl_send, int nvl_recv, int rdma_send, int rdma_recv) {
             new (self) Config();
             self->num_sms = num_sms;
             self->num_max_nvl_chunked_send_tokens = nvl_send;
             self->num_max_nvl_chunked_recv_tokens = nvl_recv;
             self->num_max_rdma_chunked_send_tokens = rdma_send;
             self->num_max_rdma_chunked_recv_tokens = rdma_recv;
           },
           nb::arg("num_sms") = defaults.num_sms,
           nb::arg("num_max_nvl_chunked_send_tokens") = defaults.num_max_nvl_chunked_send_tokens,
           nb::arg("num_max_nvl_chunked_recv_tokens") = defaults.num_max_nvl_chunked_recv_tokens,
           nb::arg("num_max_rdma_chunked_send_tokens") = defaults.num_max_rdma_chunked_send_tokens,
           nb::arg("num_max_rdma_chunked_recv_tokens") = defaults.num_max_rdma_chunked_recv_tokens)
      .def_rw("num_sms", &Config::num_sms)
      .def_rw("num_max_nvl_chunked_send_tokens", &Config::num_max_nvl_chunked_send_tokens)
      .def_rw("num_max_nvl_chunked_recv_tokens", &Config::num_max_nvl_chunked_recv_tokens)
      .def_rw("num_max_rdma_chunked_send_tokens", &Config::num_max_rdma_chunked_send_tokens)
      .def_rw("num_max_rdma_chunked_recv_tokens", &Config::num_max_rdma_chunked_recv_tokens)
      .def_prop_rw(
          "combine_layout", [](const Config& config) { return std::string(combine_layout_name(config.combine_layout)); },
          [](Config& config, const std::string& name) { config.combine_layout = parse_combine_layout(name); },
          "where combine puts its channels' senders and receivers: 'split' (default) or 'colocated' (epcomm's own; "
          "docs/PERF.md says when each is faster)")
      .def("validate", &Config::validate)
      .def("get_nvl_buffer_size_hint", &Config::nvl_buffer_size_hint, nb::arg("hidden_bytes"), nb::arg("num_ranks"),
           nb::arg("num_nodes") = 1)
      .def("get_rdma_buffer_size_hint",
           [](const Config& config, int64_t hidden_bytes, int num_ranks) {
             // deep_ep's nodes: one up to 8 ranks; past 8, nodes of 8, or the split a host of
             // num_ranks makes itself (12 -> 2 x 6, 9 -> 3 x 3), never fewer nodes than deep_ep's.
             const int nodes = num_ranks <= kMaxNvlPeers ? 1 : num_ranks / detail::default_ranks_per_node(num_ranks);
             return config.rdma_buffer_size_hint(hidden_bytes, nodes);
           },
           nb::arg("hidden_bytes"), nb::arg("num_ranks"),
           "num_rdma_bytes for hierarchical normal mode past 8 ranks, in nodes of at most 8 as one host of "
           "num_ranks splits itself (0 up to 8 ranks); with other node sizes, "
           "Config.rdma_buffer_size_hint(hidden_bytes, num_nodes) (epcomm's own)")
      .def("rdma_buffer_size_hint", &Config::rdma_buffer_size_hint, nb::arg("hidden_bytes"), nb::arg("num_nodes"));
  m.def("cuda_device_count", [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return count;
  }, "CUDA devices visible to this process (0 without a usable driver).");
  m.def("default_dispatch_config", &default_dispatch_config, nb::arg("num_ranks"));
  m.def("default_combine_config", &default_combine_config, nb::arg("num_ranks"));
  m.def("low_latency_buffer_size_hint", &Buffer::low_latency_buffer_size_hint, nb::arg("num_max_dispatch_tokens_per_rank"),
        nb::arg("hidden"), nb::arg("num_ranks"), nb::arg("num_experts"));
  nb::class_<PythonBootstrap>(m, "Bootstrap", "Rank-to-rank byte exchange through Python callables.")
      .def(nb::init<int, int, nb::object, nb::object>(), nb::arg("rank"), nb::arg("num_ranks"), nb::arg("allgather"),
           nb::arg("barrier"));
  nb::class_<WarmupShape>(m, "WarmupShape",
                          "The largest calls to expect: preinitialize / warmup() grow output memory to fit them.")
      .def(nb::init<>())
      .def("__init__",
           [](WarmupShape* self, int num_tokens, int num_low_latency_tokens, int hidden, int num_topk, int num_experts) {
             new (self) WarmupShape{num_tokens, num_low_latency_tokens, hidden, num_topk, num_experts};
           },
           nb::kw_only(), nb::arg("num_tokens") = 0, nb::arg("num_low_latency_tokens") = 0, nb::arg("hidden"),
           nb::arg("num_topk"), nb::arg("num_experts"))
      .def_rw("num_tokens", &WarmupShape::num_tokens)
      .def_rw("num_low_latency_tokens", &WarmupShape::num_low_latency_tokens)
      .def_rw("hidden", &WarmupShape::hidden)
      .def_rw("num_topk", &WarmupShape::num_topk)
      .def_rw("num_experts", &WarmupShape::num_experts);
  nb::class_<PythonAllocator>(m, "Allocator",
                              "Output memory: torch.empty on `device` where the call's stream is torch's current one "
                              "there, else a Python callable: ([(dtype, shape), ...], stream) -> [(ptr, owner), ...].")
      .def(nb::init<nb::object, int>(), nb::arg("allocate"), nb::arg("device") = -1)
      // For tests without a GPU: one [rows, cols] output allocated as a call allocates it; its owner.
      .def("_allocate_for_test",
           [](PythonAllocator& allocator, DType dtype, int64_t rows, int64_t cols, uintptr_t stream) {
             return owner_of(allocator.allocate(dtype, {rows, cols}, as_stream(stream)));
           },
           nb::arg("dtype"), nb::arg("rows"), nb::arg("cols"), nb::arg("stream") = 0);
  nb::class_<RecvHook>(m, "RecvHook")
      .def("__call__", [](const RecvHook& hook) { hook(); }, nb::call_guard<nb::gil_scoped_release>())
      .def("__call__", [](const RecvHook& hook, uintptr_t stream) { hook(as_stream(stream)); },
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("empty", &RecvHook::empty);
  // The routing tensors of a handle, as torch tensors that keep the handle (and so its memory) alive.
  auto routing = [](TensorView (DispatchHandle::*get)() const) {
    return [get](nb::handle self) { return device_tensor(self, (nb::cast<const DispatchHandle&>(self).*get)()); };
  };
  nb::class_<DispatchHandle>(m, "DispatchHandle")
      .def_prop_ro("num_tokens", &DispatchHandle::num_tokens)
      .def_prop_ro("num_recv_tokens", &DispatchHandle::num_recv_tokens)
      .def_prop_ro("num_rows", &DispatchHandle::num_rows)
      .def_prop_ro("num_channels", &DispatchHandle::num_channels)
      .def_prop_ro("recv_src_idx", routing(&DispatchHandle::recv_src_idx))
      .def_prop_ro("hierarchical", &DispatchHandle::hierarchical)
      .def_prop_ro("rail_stage", &DispatchHandle::rail_stage)
      .def_prop_ro("num_channel_segments", &DispatchHandle::num_channel_segments)
      .def_prop_ro("recv_channel_prefix", routing(&DispatchHandle::recv_channel_prefix))
      .def_prop_ro("recv_channel_count", routing(&DispatchHandle::recv_channel_count))
      .def_prop_ro("send_position", routing(&DispatchHandle::send_position))
      .def_prop_ro("is_token_in_rank", routing(&DispatchHandle::is_token_in_rank))
      .def_prop_ro("rank_prefix_matrix", routing(&DispatchHandle::rank_prefix_matrix));
  auto low_latency_routing = [](TensorView (LowLatencyHandle::*get)() const) {
    return [get](nb::handle self) { return device_tensor(self, (nb::cast<const LowLatencyHandle&>(self).*get)()); };
  };
  nb::class_<LowLatencyHandle>(m, "LowLatencyHandle")
      .def_prop_ro("recv_src_info", low_latency_routing(&LowLatencyHandle::recv_src_info))
      .def_prop_ro("recv_count_from", low_latency_routing(&LowLatencyHandle::recv_count_from))
      .def_prop_ro("num_max_dispatch_tokens_per_rank", &LowLatencyHandle::num_max_dispatch_tokens_per_rank)
      .def_prop_ro("hidden", &LowLatencyHandle::hidden)
      .def_prop_ro("num_experts", &LowLatencyHandle::num_experts);
}

}  // namespace

namespace {

BufferOptions make_options(int64_t num_nvl_bytes, int64_t num_rdma_bytes, bool low_latency_mode, int num_qps_per_rank,
                           bool allow_nvlink_for_low_latency_mode, int device, bool preinitialize,
                           bool initialize_in_background, int64_t wait_timeout_ms, int emulated_nodes,
                           const WarmupShape& warmup_shape, std::shared_ptr<PythonAllocator> output_allocator,
                           std::optional<uintptr_t> warmup_stream, std::optional<uintptr_t> comm_stream,
                           bool enable_shrink, const std::string& transport, int ranks_per_node,
                           int64_t num_rail_bytes, bool explicitly_destroy) {
  BufferOptions options;
  options.explicitly_destroy = explicitly_destroy;
  options.num_rail_bytes = num_rail_bytes;
  options.ranks_per_node = ranks_per_node;
  options.transport = parse_transport_kind(transport, "Buffer: transport");
  options.enable_shrink = enable_shrink;
  options.emulated_nodes = emulated_nodes;
  options.num_nvl_bytes = num_nvl_bytes;
  options.num_rdma_bytes = num_rdma_bytes;
  options.low_latency_mode = low_latency_mode;
  options.num_qps_per_rank = num_qps_per_rank;
  options.allow_nvlink_for_low_latency_mode = allow_nvlink_for_low_latency_mode;
  options.device = device;
  options.preinitialize = preinitialize;
  options.initialize_in_background = initialize_in_background;
  options.wait_timeout = std::chrono::milliseconds(wait_timeout_ms);
  options.warmup_shape = warmup_shape;
  options.output_allocator = std::move(output_allocator);
  if (warmup_stream) options.warmup_stream = as_stream(*warmup_stream);
  if (comm_stream) options.comm_stream = as_stream(*comm_stream);
  return options;
}

// BufferOptions' defaults, defined once in C++ (include/epcomm/config.hpp): the binding's keyword
// defaults and _C.BUFFER_DEFAULTS, which the Python layer's own signatures read.
nb::dict buffer_defaults(const BufferOptions& defaults) {
  nb::dict values;
  values["num_nvl_bytes"] = defaults.num_nvl_bytes;
  values["num_rdma_bytes"] = defaults.num_rdma_bytes;
  values["low_latency_mode"] = defaults.low_latency_mode;
  values["num_qps_per_rank"] = defaults.num_qps_per_rank;
  values["allow_nvlink_for_low_latency_mode"] = defaults.allow_nvlink_for_low_latency_mode;
  values["preinitialize"] = defaults.preinitialize;
  values["initialize_in_background"] = defaults.initialize_in_background;
  values["wait_timeout_ms"] = static_cast<int64_t>(defaults.wait_timeout.count());
  values["emulated_nodes"] = defaults.emulated_nodes;
  values["ranks_per_node"] = defaults.ranks_per_node;
  values["num_rail_bytes"] = defaults.num_rail_bytes;
  values["enable_shrink"] = defaults.enable_shrink;
  values["explicitly_destroy"] = defaults.explicitly_destroy;
  return values;
}

}  // namespace

void bind_buffer(nb::module_& m) {
  bind_types(m);
  const BufferOptions defaults;
  m.attr("BUFFER_DEFAULTS") = buffer_defaults(defaults);
  nb::class_<Buffer>(m, "Buffer")
      .def("__init__",
           [](Buffer* self, std::shared_ptr<PythonBootstrap> bootstrap, int64_t num_nvl_bytes, int64_t num_rdma_bytes,
              bool low_latency_mode, int num_qps_per_rank, bool allow_nvlink, int device, bool preinitialize,
              bool in_background, int64_t wait_timeout_ms, int emulated_nodes, const WarmupShape& warmup_shape,
              std::shared_ptr<PythonAllocator> output_allocator, std::optional<uintptr_t> warmup_stream,
              std::optional<uintptr_t> comm_stream, bool enable_shrink, const std::string& transport,
              int ranks_per_node, int64_t num_rail_bytes, bool explicitly_destroy) {
             const BufferOptions options =
                 make_options(num_nvl_bytes, num_rdma_bytes, low_latency_mode, num_qps_per_rank, allow_nvlink, device,
                              preinitialize, in_background, wait_timeout_ms, emulated_nodes, warmup_shape,
                              std::move(output_allocator), warmup_stream, comm_stream, enable_shrink, transport,
                              ranks_per_node, num_rail_bytes, explicitly_destroy);
             nb::gil_scoped_release release;  // the exchange calls back into Python from C++
             new (self) Buffer(std::move(bootstrap), options);
           },
           nb::arg("bootstrap"), nb::arg("num_nvl_bytes") = defaults.num_nvl_bytes,
           nb::arg("num_rdma_bytes") = defaults.num_rdma_bytes, nb::arg("low_latency_mode") = defaults.low_latency_mode,
           nb::arg("num_qps_per_rank") = defaults.num_qps_per_rank,
           nb::arg("allow_nvlink_for_low_latency_mode") = defaults.allow_nvlink_for_low_latency_mode,
           nb::arg("device") = defaults.device, nb::arg("preinitialize") = defaults.preinitialize,
           nb::arg("initialize_in_background") = defaults.initialize_in_background,
           nb::arg("wait_timeout_ms") = static_cast<int64_t>(defaults.wait_timeout.count()),
           nb::arg("emulated_nodes") = defaults.emulated_nodes,
           nb::arg("warmup_shape") = WarmupShape{}, nb::arg("output_allocator").none() = nb::none(),
           nb::arg("warmup_stream").none() = nb::none(), nb::arg("comm_stream").none() = nb::none(),
           nb::arg("enable_shrink") = defaults.enable_shrink, nb::arg("transport") = "auto",
           nb::arg("ranks_per_node") = defaults.ranks_per_node, nb::arg("num_rail_bytes") = defaults.num_rail_bytes,
           nb::arg("explicitly_destroy") = defaults.explicitly_destroy)
      .def_prop_ro("rank", &Buffer::rank)
      .def_prop_ro("num_ranks", &Buffer::num_ranks)
      .def_prop_ro("device", &Buffer::device, nb::call_guard<nb::gil_scoped_release>())
      // deep_ep's runtime queries, for code that reaches into Buffer.runtime: an RDMA rank is a
      // node, and the root RDMA rank (global) is this rank's index inside its node.
      .def("get_num_rdma_ranks", &Buffer::num_nodes, nb::call_guard<nb::gil_scoped_release>())
      .def("get_rdma_rank", &Buffer::node, nb::call_guard<nb::gil_scoped_release>())
      .def("get_root_rdma_rank", [](const Buffer& b, bool global) { return global ? b.local_rank() : 0; },
           nb::arg("global"), nb::call_guard<nb::gil_scoped_release>())
      .def("get_local_device_id", &Buffer::device, nb::call_guard<nb::gil_scoped_release>())
      .def("is_available", &Buffer::is_available, nb::call_guard<nb::gil_scoped_release>())
      .def("comm_stream", [](const Buffer& b) { return reinterpret_cast<uintptr_t>(b.comm_stream()); },
           nb::call_guard<nb::gil_scoped_release>())
      .def("warmup", [](Buffer& b, uintptr_t s) { b.warmup(as_stream(s)); }, nb::call_guard<nb::gil_scoped_release>())
      .def("destroy", &Buffer::destroy, nb::call_guard<nb::gil_scoped_release>())
      .def("barrier", [](Buffer& b, uintptr_t s) { b.barrier(as_stream(s)); }, nb::call_guard<nb::gil_scoped_release>())
      .def("synchronize", [](Buffer& b, uintptr_t s) { b.synchronize(as_stream(s)); },
           nb::call_guard<nb::gil_scoped_release>())
      .def("check_device_errors", &Buffer::check_device_errors, nb::call_guard<nb::gil_scoped_release>())
      .def("initialization_phases",
           [](const Buffer& b) {
             std::vector<std::pair<std::string, double>> phases;
             for (const InitPhase& phase : b.initialization_phases()) phases.emplace_back(phase.name, phase.milliseconds);
             return phases;
           },
           nb::call_guard<nb::gil_scoped_release>())
      // The calls take torch tensors (or None) and run on torch's current stream; each releases the
      // GIL while it runs and returns its outputs as torch tensors, in the order of its Result
      // struct. Views and outputs go through the TorchBridge: no Python code runs on the way.
      .def("get_dispatch_layout",
           [](Buffer& b, nb::handle topk_idx, int num_experts) {
             const TorchBridge& torch = TorchBridge::get();
             const TensorView ids = torch.view(topk_idx, "topk_idx");
             int device = 0;
             int nodes = 1;
             {
               nb::gil_scoped_release release;  // both may wait for a background initialisation
               device = b.device();
               nodes = b.num_nodes();
             }
             if (ids.ndim > 0 && torch.device_of(topk_idx) != device) {
               fail(ErrorCode::kInvalidArgument, "get_dispatch_layout: topk_idx is on cuda:", torch.device_of(topk_idx),
                    ", but this Buffer's device is cuda:", device);
             }
             const int ranks = b.num_ranks();
             void* const no_data = nullptr;  // torch.empty fills it in
             // The runtime checks num_experts: one out of range must reach it, not fail in torch.empty.
             DispatchLayoutOutputs outputs{
                 TensorView::contiguous(no_data, DType::kInt32, {ranks}),
                 TensorView::contiguous(no_data, DType::kInt32, {std::clamp(num_experts, 0, kLayoutMaxExperts + 1)}),
                 TensorView::contiguous(no_data, DType::kBool, {ids.ndim > 0 ? ids.shape[0] : 0, ranks}),
                 nodes > 1 ? TensorView::contiguous(no_data, DType::kInt32, {nodes}) : TensorView{}};
             nb::object per_rank = torch.empty(outputs.num_tokens_per_rank, device);
             nb::object per_expert = torch.empty(outputs.num_tokens_per_expert, device);
             nb::object in_rank = torch.empty(outputs.is_token_in_rank, device);
             nb::object per_node = nodes > 1 ? torch.empty(outputs.num_tokens_per_rdma_rank, device) : nb::none();
             const cudaStream_t stream = torch.current_stream(device);
             {
               nb::gil_scoped_release release;
               b.get_dispatch_layout(ids, num_experts, outputs, stream);
             }
             return nb::make_tuple(per_rank, per_node, per_expert, in_rank);
           },
           nb::arg("topk_idx").none(), nb::arg("num_experts"),
           "-> (num_tokens_per_rank, num_tokens_per_rdma_rank or None on one node, num_tokens_per_expert, is_token_in_rank)")
      .def("dispatch",
           [](Buffer& b, nb::handle x, nb::handle x_scales, nb::handle topk_idx, nb::handle topk_weights,
              nb::handle num_tokens_per_rank, nb::handle num_tokens_per_expert, nb::handle is_token_in_rank,
              const DispatchHandle* handle, int expert_alignment, int num_worst_tokens, const Config& config,
              PythonAllocator& allocator, const Event& previous_event, bool async_finish, bool allocate_on_comm_stream) {
             const TorchBridge& torch = TorchBridge::get();
             DispatchArgs args;
             args.x = torch.view(x, "x");
             args.x_scales = torch.view(x_scales, "x_scales");
             args.topk_idx = torch.view(topk_idx, "topk_idx");
             args.topk_weights = torch.view(topk_weights, "topk_weights");
             args.num_tokens_per_rank = torch.view(num_tokens_per_rank, "num_tokens_per_rank");
             args.num_tokens_per_expert = torch.view(num_tokens_per_expert, "num_tokens_per_expert");
             args.is_token_in_rank = torch.view(is_token_in_rank, "is_token_in_rank");
             args.handle = handle;
             args.expert_alignment = expert_alignment;
             args.num_worst_tokens = num_worst_tokens;
             args.config = config;
             const CallOptions call = on_current_stream(torch, b, previous_event, async_finish, allocate_on_comm_stream);
             const DispatchResult result = without_gil([&] { return b.dispatch(args, allocator, call); });
             return nb::make_tuple(owner_of(result.recv_x), owner_of(result.recv_x_scales), owner_of(result.recv_topk_idx),
                                   owner_of(result.recv_topk_weights), result.num_recv_tokens_per_expert, result.handle,
                                   result.event);
           },
           nb::arg("x").none(), nb::arg("x_scales").none(), nb::arg("topk_idx").none(), nb::arg("topk_weights").none(),
           nb::arg("num_tokens_per_rank").none(), nb::arg("num_tokens_per_expert").none(), nb::arg("is_token_in_rank").none(),
           nb::arg("handle").none(), nb::arg("expert_alignment"), nb::arg("num_worst_tokens"), nb::arg("config"),
           nb::arg("allocator"), nb::arg("previous_event"), nb::arg("async_finish"), nb::arg("allocate_on_comm_stream"))
      .def("combine",
           [](Buffer& b, nb::handle x, nb::handle topk_weights, nb::handle bias0, nb::handle bias1,
              const DispatchHandle* handle, const Config& config, PythonAllocator& allocator, const Event& previous_event,
              bool async_finish, bool allocate_on_comm_stream) {
             const TorchBridge& torch = TorchBridge::get();
             CombineArgs args;
             args.x = torch.view(x, "x");
             args.topk_weights = torch.view(topk_weights, "topk_weights");
             args.bias0 = torch.view(bias0, "bias[0]");
             args.bias1 = torch.view(bias1, "bias[1]");
             args.handle = handle;
             args.config = config;
             const CallOptions call = on_current_stream(torch, b, previous_event, async_finish, allocate_on_comm_stream);
             const CombineResult result = without_gil([&] { return b.combine(args, allocator, call); });
             return nb::make_tuple(owner_of(result.combined_x), owner_of(result.combined_topk_weights), result.event);
           },
           nb::arg("x").none(), nb::arg("topk_weights").none(), nb::arg("bias0").none(), nb::arg("bias1").none(), nb::arg("handle").none(),
           nb::arg("config"), nb::arg("allocator"), nb::arg("previous_event"), nb::arg("async_finish"),
           nb::arg("allocate_on_comm_stream"))
      .def("low_latency_dispatch",
           [](Buffer& b, nb::handle x, nb::handle topk_idx, int num_max_dispatch_tokens_per_rank, int num_experts,
              nb::handle cumulative_local_expert_recv_stats, nb::handle wait_recv_cost_stats, bool use_fp8,
              bool round_scale, bool use_ue8m0, bool return_recv_hook, PythonAllocator& allocator, bool async_finish) {
             const TorchBridge& torch = TorchBridge::get();
             LowLatencyDispatchArgs args;
             args.x = torch.view(x, "x");
             args.topk_idx = torch.view(topk_idx, "topk_idx");
             args.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank;
             args.num_experts = num_experts;
             args.cumulative_local_expert_recv_stats =
                 torch.view(cumulative_local_expert_recv_stats, "cumulative_local_expert_recv_stats");
             args.wait_recv_cost_stats = torch.view(wait_recv_cost_stats, "dispatch_wait_recv_cost_stats");
             args.use_fp8 = use_fp8;
             args.round_scale = round_scale;
             args.use_ue8m0 = use_ue8m0;
             args.return_recv_hook = return_recv_hook;
             const CallOptions call = on_current_stream(torch, b, Event{}, async_finish, false);
             const LowLatencyDispatchResult result =
                 without_gil([&] { return b.low_latency_dispatch(args, allocator, call); });
             return nb::make_tuple(owner_of(result.recv_x), owner_of(result.recv_x_scales), owner_of(result.recv_count),
                                   result.handle, result.event, result.hook);
           },
           nb::arg("x").none(), nb::arg("topk_idx").none(), nb::arg("num_max_dispatch_tokens_per_rank"), nb::arg("num_experts"),
           nb::arg("cumulative_local_expert_recv_stats").none(), nb::arg("wait_recv_cost_stats").none(), nb::arg("use_fp8"),
           nb::arg("round_scale"), nb::arg("use_ue8m0"), nb::arg("return_recv_hook"), nb::arg("allocator"),
           nb::arg("async_finish"))
      .def("low_latency_combine",
           [](Buffer& b, nb::handle x, nb::handle topk_idx, nb::handle topk_weights, const LowLatencyHandle* handle,
              bool zero_copy, bool use_logfmt, nb::handle out, bool return_recv_hook, nb::handle wait_recv_cost_stats,
              PythonAllocator& allocator, bool async_finish) {
             const TorchBridge& torch = TorchBridge::get();
             LowLatencyCombineArgs args;
             args.x = torch.view(x, "x");
             args.topk_idx = torch.view(topk_idx, "topk_idx");
             args.topk_weights = torch.view(topk_weights, "topk_weights");
             args.handle = handle;
             args.zero_copy = zero_copy;
             args.use_logfmt = use_logfmt;
             args.out = torch.view(out, "out");
             args.return_recv_hook = return_recv_hook;
             args.wait_recv_cost_stats = torch.view(wait_recv_cost_stats, "combine_wait_recv_cost_stats");
             const CallOptions call = on_current_stream(torch, b, Event{}, async_finish, false);
             const LowLatencyCombineResult result =
                 without_gil([&] { return b.low_latency_combine(args, allocator, call); });
             return nb::make_tuple(owner_of(result.combined_x), result.event, result.hook);
           },
           nb::arg("x").none(), nb::arg("topk_idx").none(), nb::arg("topk_weights").none(), nb::arg("handle").none(), nb::arg("zero_copy"),
           nb::arg("use_logfmt"), nb::arg("out").none(), nb::arg("return_recv_hook"), nb::arg("wait_recv_cost_stats").none(),
           nb::arg("allocator"), nb::arg("async_finish"))
      .def("get_next_low_latency_combine_buffer",
           [](nb::handle self, const LowLatencyHandle& handle) {
             Buffer& buffer = nb::cast<Buffer&>(self);
             TensorView view;
             {
               nb::gil_scoped_release release;  // may wait for a background initialisation
               view = buffer.get_next_low_latency_combine_buffer(handle);
             }
             // A torch tensor (through DLPack; no numpy) over the Buffer's own memory, keeping the
             // Buffer alive for as long as the tensor lives.
             const size_t shape[3] = {static_cast<size_t>(view.shape[0]), static_cast<size_t>(view.shape[1]),
                                      static_cast<size_t>(view.shape[2])};
             const nb::dlpack::dtype bf16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
             return nb::ndarray<nb::pytorch, nb::device::cuda>(view.data, 3, shape, self, nullptr, bf16,
                                                               nb::device::cuda::value, buffer.device());
           },
           nb::arg("handle"))
      .def("local_buffer_bytes",
           [](nb::handle self, bool use_rdma_buffer) {
             Buffer& buffer = nb::cast<Buffer&>(self);
             char* data = nullptr;
             {
               nb::gil_scoped_release release;  // may wait for a background initialisation
               data = static_cast<char*>(use_rdma_buffer ? buffer.local_rdma_buffer() : buffer.local_nvl_buffer());
             }
             const int64_t bytes = use_rdma_buffer ? buffer.options().num_rdma_bytes : buffer.options().num_nvl_bytes;
             if (bytes == 0) {
               fail(ErrorCode::kInvalidArgument, "local_buffer_bytes: the Buffer has no ",
                    use_rdma_buffer ? "RDMA buffer (num_rdma_bytes=0)" : "NVLink buffer (num_nvl_bytes=0)");
             }
             if (data == nullptr) fail(ErrorCode::kInvalidArgument, "local_buffer_bytes: the Buffer was destroyed");
             const size_t shape[1] = {static_cast<size_t>(bytes)};
             return nb::ndarray<nb::pytorch, nb::device::cuda>(data, 1, shape, self, nullptr, nb::dtype<uint8_t>(),
                                                               nb::device::cuda::value, buffer.device());
           },
           nb::arg("use_rdma_buffer"), "This rank's raw NVLink buffer (or low-latency region) as uint8, over the Buffer's memory.")
      .def("clean_low_latency_buffer",
           [](Buffer& b, int max_tokens, int hidden, int num_experts, uintptr_t stream) {
             b.clean_low_latency_buffer(max_tokens, hidden, num_experts, as_stream(stream));
           },
           nb::call_guard<nb::gil_scoped_release>())
      .def("low_latency_update_mask_buffer",
           [](Buffer& b, int rank_to_mask, bool mask, uintptr_t stream) {
             b.low_latency_update_mask_buffer(rank_to_mask, mask, as_stream(stream));
           },
           nb::call_guard<nb::gil_scoped_release>())
      .def("low_latency_query_mask_buffer",
           [](Buffer& b, const TensorView& mask_status, uintptr_t stream) {
             b.low_latency_query_mask_buffer(mask_status, as_stream(stream));
           },
           nb::call_guard<nb::gil_scoped_release>())
      .def("low_latency_clean_mask_buffer",
           [](Buffer& b, uintptr_t stream) { b.low_latency_clean_mask_buffer(as_stream(stream)); },
           nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace epcomm::python
