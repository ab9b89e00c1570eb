// Tensor views, dtypes and error messages: the host logic every operation's validation uses.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "epcomm/error.hpp"
#include "epcomm/types.hpp"
#include "runtime/tensor_group.hpp"
#include "runtime/validate.hpp"

namespace epcomm {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kFloat8E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_STREQ(dtype_name(DType::kFloat8E4M3), "float8_e4m3fn");
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
}

TEST(TensorView, ContiguousShapeAndStrides) {
  int64_t storage[24];
  const TensorView view = TensorView::contiguous(storage, DType::kInt64, {2, 3, 4});
  EXPECT_EQ(view.ndim, 3);
  EXPECT_EQ(view.numel(), 24);
  EXPECT_EQ(view.nbytes(), 24u * 8u);
  EXPECT_EQ(view.strides[0], 12);
  EXPECT_EQ(view.strides[1], 4);
  EXPECT_EQ(view.strides[2], 1);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(view.describe(), "int64[2, 3, 4]");
}

TEST(TensorView, NonContiguousIsDetected) {
  int64_t storage[24];
  TensorView view = TensorView::contiguous(storage, DType::kInt64, {4, 3});
  view.strides[0] = 6;  // every other row of a wider tensor
  EXPECT_FALSE(view.is_contiguous());
  EXPECT_EQ(view.describe(), "int64[4, 3] (non-contiguous)");
  // A dimension of extent 1 may carry any stride.
  TensorView row = TensorView::contiguous(storage, DType::kInt64, {1, 3});
  row.strides[0] = 1000;
  EXPECT_TRUE(row.is_contiguous());
}

TEST(TensorView, EmptyAndRejectedShapes) {
  const TensorView empty = TensorView::contiguous(static_cast<void*>(nullptr), DType::kBFloat16, {0, 7168});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.is_contiguous());
  EXPECT_THROW(TensorView::contiguous(static_cast<void*>(nullptr), DType::kInt32, {1, 2, 3, 4, 5}), Error);
  EXPECT_THROW(TensorView::contiguous(static_cast<void*>(nullptr), DType::kInt32, {-1}), Error);
}

TEST(Validate, MessagesNameTheArgumentAndTheValue) {
  int64_t storage[8];
  const TensorView floats = TensorView::contiguous(storage, DType::kFloat32, {2, 4});
  try {
    detail::require_device_tensor(0, "get_dispatch_layout", "topk_idx", floats, {DType::kInt64, DType::kInt32},
                                  {detail::kAnyExtent, detail::kAnyExtent});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(error.what(),
                 "InvalidArgument: get_dispatch_layout: topk_idx must be int64 or int32[*, *], got float32[2, 4]");
  }
  try {
    detail::require_in_range("get_dispatch_layout", "num_experts", 5000, 1, 4096);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "InvalidArgument: get_dispatch_layout: num_experts=5000 must be in [1, 4096]");
  }
}

TEST(Validate, ShapeMismatchAndHostMemoryAreRejected) {
  int64_t storage[8] = {};
  const TensorView ids = TensorView::contiguous(storage, DType::kInt64, {2, 4});
  EXPECT_THROW(detail::require_device_tensor(0, "op", "ids", ids, {DType::kInt64}, {2, 5}), Error);
  // Stack memory is not device memory (with or without a GPU present).
  try {
    detail::require_device_tensor(0, "op", "ids", ids, {DType::kInt64}, {2, 4});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("is not device memory"), std::string::npos) << error.what();
  }
  // Empty tensors need no memory at all.
  const TensorView empty = TensorView::contiguous(static_cast<void*>(nullptr), DType::kInt64, {0, 4});
  EXPECT_NO_THROW(detail::require_device_tensor(0, "op", "ids", empty, {DType::kInt64}, {0, 4}));
}

TEST(Validate, ExtentsAnIntCannotHoldAreRefusedByName) {
  int64_t storage[8] = {};
  // An 8 GiB row would be cut to 8 elements by the calls' int hidden; a negative extent passes
  // any "any extent" shape.
  const TensorView wide = TensorView::contiguous(storage, DType::kBFloat16, {1, (int64_t{1} << 32) + 8});
  TensorView negative = TensorView::contiguous(storage, DType::kBFloat16, {2, 4});
  negative.shape[0] = -1;
  for (const TensorView& view : {wide, negative}) {
    try {
      detail::require_device_tensor(0, "dispatch", "x", view, {DType::kBFloat16}, {detail::kAnyExtent, detail::kAnyExtent});
      FAIL() << "expected an error for " << view.describe();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("dispatch: x has extent "), std::string::npos) << error.what();
    }
  }
}

// Host memory stands in for the device: allocate_together only does address arithmetic.
class RecordingAllocator final : public Allocator {
 public:
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t) override {
    Tensor tensor;
    tensor.view = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
    requested_bytes.push_back(tensor.view.nbytes());
    auto memory = std::make_shared<std::vector<unsigned char>>(tensor.view.nbytes() + detail::kTensorGroupAlignment);
    // Aligned as a device allocation would be.
    const uintptr_t start = reinterpret_cast<uintptr_t>(memory->data());
    tensor.view.data = reinterpret_cast<void*>((start + detail::kTensorGroupAlignment - 1) /
                                               detail::kTensorGroupAlignment * detail::kTensorGroupAlignment);
    tensor.storage = memory;
    return tensor;
  }
  std::vector<size_t> requested_bytes;
};

TEST(TensorGroup, OneAllocationCarvedIntoAlignedPiecesInOrder) {
  RecordingAllocator allocator;
  const std::vector<Tensor> pieces = detail::allocate_together(
      allocator, {detail::piece(DType::kInt32, {3, 5}), detail::piece(DType::kBool, {0, 8}),
                  detail::piece(DType::kBool, {7, 3}), detail::piece(DType::kInt64, {300})},
      nullptr);
  ASSERT_EQ(allocator.requested_bytes.size(), 1u);
  // 60 -> 256, empty -> 0, 21 -> 256, 2400 -> 2560.
  EXPECT_EQ(allocator.requested_bytes[0], 256u + 0u + 256u + 2560u);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].view.describe(), "int32[3, 5]");
  EXPECT_EQ(pieces[1].view.describe(), "bool[0, 8]");
  EXPECT_EQ(pieces[1].view.data, nullptr);  // an empty piece has no memory, as from an allocator
  EXPECT_EQ(pieces[2].view.describe(), "bool[7, 3]");
  EXPECT_EQ(pieces[3].view.describe(), "int64[300]");
  const auto* base = static_cast<const char*>(pieces[0].view.data);
  EXPECT_EQ(static_cast<const char*>(pieces[2].view.data) - base, 256);
  EXPECT_EQ(static_cast<const char*>(pieces[3].view.data) - base, 512);
  for (const Tensor& piece : pieces) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece.view.data) % detail::kTensorGroupAlignment, 0u);
    EXPECT_EQ(piece.storage, pieces[0].storage);  // one lifetime: the group's memory
  }
}

TEST(TensorGroup, MemoryLivesWhileAnyPieceDoes) {
  RecordingAllocator allocator;
  std::weak_ptr<void> memory;
  {
    Tensor last;
    {
      const std::vector<Tensor> pieces = detail::allocate_together(
          allocator, {detail::piece(DType::kInt32, {4}), detail::piece(DType::kInt32, {4})}, nullptr);
      memory = pieces[0].storage;
      last = pieces[1];
    }
    EXPECT_FALSE(memory.expired());
  }
  EXPECT_TRUE(memory.expired());
}

TEST(TensorGroup, WhatFreeingNeedsIsReleasedAfterTheMemory) {
  std::vector<std::string> released;
  class OrderedAllocator final : public Allocator {
   public:
    explicit OrderedAllocator(std::vector<std::string>& log) : log_(log) {}
    Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t) override {
      Tensor tensor;
      tensor.view = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape);
      tensor.storage = std::shared_ptr<void>(&log_, [this](void*) { log_.push_back("memory"); });
      tensor.view.data = &log_;
      return tensor;
    }

   private:
    std::vector<std::string>& log_;
  } allocator(released);
  {
    std::shared_ptr<void> stream(&released, [&](void*) { released.push_back("stream"); });
    std::vector<Tensor> pieces =
        detail::allocate_together(allocator, {detail::piece(DType::kInt32, {4})}, nullptr, std::move(stream));
    EXPECT_TRUE(released.empty());
  }
  EXPECT_EQ(released, (std::vector<std::string>{"memory", "stream"}));
}

TEST(TensorGroup, AllEmptyPiecesAllocateNothingUsable) {
  RecordingAllocator allocator;
  const std::vector<Tensor> pieces =
      detail::allocate_together(allocator, {detail::piece(DType::kInt32, {0}), detail::piece(DType::kBool, {0, 4})}, nullptr);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].view.data, nullptr);
  EXPECT_EQ(pieces[1].view.data, nullptr);
  EXPECT_EQ(allocator.requested_bytes, std::vector<size_t>{0u});
}

TEST(Allocator, ManyByDefaultIsOneAllocateEachInOrder) {
  RecordingAllocator allocator;
  const std::vector<Tensor> made = allocator.allocate_many(
      {detail::piece(DType::kBFloat16, {3}), detail::piece(DType::kInt64, {2, 5}), detail::piece(DType::kFloat32, {2, 3, 4}),
       detail::piece(DType::kUInt8, {1, 2, 3, 4})},
      nullptr);
  EXPECT_EQ(allocator.requested_bytes, (std::vector<size_t>{6u, 80u, 96u, 24u}));
  ASSERT_EQ(made.size(), 4u);
  EXPECT_EQ(made[0].view.describe(), "bfloat16[3]");
  EXPECT_EQ(made[1].view.describe(), "int64[2, 5]");
  EXPECT_EQ(made[2].view.describe(), "float32[2, 3, 4]");
  EXPECT_EQ(made[3].view.describe(), "uint8[1, 2, 3, 4]");
  for (const Tensor& tensor : made) {
    EXPECT_NE(tensor.view.data, nullptr);
    EXPECT_TRUE(tensor.view.is_contiguous());
  }
  EXPECT_NE(made[0].storage, made[1].storage);  // separate tensors, freed one by one
}

// Counts allocate_many calls: an allocator whose calls are costly (Python's) overrides it.
class BatchCountingAllocator final : public Allocator {
 public:
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape, cudaStream_t stream) override {
    return inner.allocate(dtype, shape, stream);
  }
  std::vector<Tensor> allocate_many(const std::vector<TensorView>& shapes, cudaStream_t stream) override {
    ++batches;
    return Allocator::allocate_many(shapes, stream);
  }
  RecordingAllocator inner;
  int batches = 0;
};

TEST(OutputBatch, FillsEveryAddedTensorFromOneCall) {
  BatchCountingAllocator allocator;
  Tensor x, scales;
  detail::OutputBatch outputs;
  outputs.add(x, DType::kFloat8E4M3, {7, 256});
  outputs.add(scales, DType::kFloat32, {7, 2});
  outputs.allocate(allocator, nullptr);
  EXPECT_EQ(allocator.batches, 1);
  EXPECT_EQ(x.view.describe(), "float8_e4m3fn[7, 256]");
  EXPECT_EQ(scales.view.describe(), "float32[7, 2]");
  EXPECT_NE(x.view.data, nullptr);
  EXPECT_NE(scales.view.data, nullptr);
  EXPECT_EQ(allocator.inner.requested_bytes, (std::vector<size_t>{7u * 256u, 7u * 2u * 4u}));
}

TEST(OutputBatch, NothingAddedCallsNothing) {
  BatchCountingAllocator allocator;
  detail::OutputBatch().allocate(allocator, nullptr);
  EXPECT_EQ(allocator.batches, 0);
}

TEST(OutputBatch, AnAllocatorThatReturnsTooFewFails) {
  class ShortAllocator final : public Allocator {
   public:
    Tensor allocate(DType, std::initializer_list<int64_t>, cudaStream_t) override { return Tensor{}; }
    std::vector<Tensor> allocate_many(const std::vector<TensorView>&, cudaStream_t) override { return {}; }
  } allocator;
  Tensor x;
  detail::OutputBatch outputs;
  outputs.add(x, DType::kBFloat16, {1, 8});
  try {
    outputs.allocate(allocator, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("allocate_many returned 0 tensors for 1 shapes"), std::string::npos)
        << error.what();
  }
}

TEST(Error, CodesHaveNamesAndMessagesCompose) {
  const Error error(ErrorCode::kTimeout, join_message("rank ", 3, " waited"));
  EXPECT_EQ(error.code(), ErrorCode::kTimeout);
  EXPECT_STREQ(error.what(), "Timeout: rank 3 waited");
}

// Callers catch running out of memory to retry with less: CUDA's allocation failure has its own
// code, every other CUDA failure stays a CUDA error (no GPU needed: the status is the call).
TEST(Error, CudaOutOfMemoryHasItsOwnCode) {
  const auto code_of = [](cudaError_t status) {
    try {
      EPCOMM_CUDA_CHECK(status);
    } catch (const Error& error) {
      return error.code();
    }
    ADD_FAILURE() << "no error for " << cudaGetErrorName(status);
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of(cudaErrorMemoryAllocation), ErrorCode::kOutOfMemory);
  EXPECT_EQ(code_of(cudaErrorInvalidValue), ErrorCode::kCudaError);
  EXPECT_STREQ(error_code_name(ErrorCode::kOutOfMemory), "OutOfMemory");
}

}  // namespace
}  // namespace epcomm
