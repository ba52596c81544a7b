// Internal to gemini/: a released chunk keeps its tensor (and every parameter
// view of it) but no memory: the storage is emptied in place and refilled when
// the chunk is needed again, so views made once stay valid.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace colossus::zero::gemini {

inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

inline void alloc_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes && storage->data() != nullptr) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

}  // namespace colossus::zero::gemini
