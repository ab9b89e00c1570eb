#include "runtime/tensor_group.hpp"

#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

size_t round_up(size_t bytes) { return (bytes + kTensorGroupAlignment - 1) / kTensorGroupAlignment * kTensorGroupAlignment; }

// Members go in reverse order: the memory first, then what freeing it needed.
struct GroupStorage {
  std::shared_ptr<void> keep_alive;
  std::shared_ptr<void> memory;
};

}  // namespace

std::vector<Tensor> allocate_together(Allocator& allocator, std::initializer_list<TensorView> pieces,
                                      cudaStream_t stream, std::shared_ptr<void> keep_alive) {
  size_t total = 0;
  for (const TensorView& piece : pieces) total += round_up(piece.nbytes());
  Tensor whole = allocator.allocate(DType::kUInt8, {static_cast<int64_t>(total)}, stream);
  if (keep_alive) {
    auto storage = std::make_shared<GroupStorage>(GroupStorage{std::move(keep_alive), std::move(whole.storage)});
    void* memory = storage->memory.get();
    whole.storage = std::shared_ptr<void>(std::move(storage), memory);
  }
  std::vector<Tensor> carved;
  carved.reserve(pieces.size());
  size_t offset = 0;
  for (const TensorView& piece : pieces) {
    Tensor tensor;
    tensor.view = piece;
    tensor.view.data = piece.nbytes() > 0 ? static_cast<char*>(whole.view.data) + offset : nullptr;
    tensor.storage = whole.storage;
    offset += round_up(piece.nbytes());
    carved.push_back(std::move(tensor));
  }
  return carved;
}

void OutputBatch::allocate(Allocator& allocator, cudaStream_t stream) {
  if (into_.empty()) return;
  std::vector<Tensor> made = allocator.allocate_many(shapes_, stream);
  if (made.size() != into_.size()) {
    fail(ErrorCode::kInvalidArgument, "Allocator::allocate_many returned ", made.size(), " tensors for ", into_.size(),
         " shapes; it must return one per shape, in order");
  }
  for (size_t i = 0; i < made.size(); ++i) *into_[i] = std::move(made[i]);
}

}  // namespace epcomm::detail
