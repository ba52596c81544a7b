// GeminiDDP, whole-parameter access for checkpoints: every chunk gathered at
// once (the gathered save), one chunk at a time (the per-rank sharded save),
// and loading whole parameters chunk by chunk without communication, so a
// load never holds more than one chunk beyond the rank's shards.
#include <ATen/ATen.h>

#include "colossus/zero/gemini/chunk_storage.h"
#include "colossus/zero/gemini/gemini_ddp.h"

namespace colossus::zero::gemini {

void GeminiDDP::with_all_gathered(const std::function<void()>& fn) {
  for (size_t c = 0; c < chunks_.size(); ++c) gather(c);
  for (size_t c = 0; c < chunks_.size(); ++c) wait_gathered(c);
  try {
    fn();
  } catch (...) {
    release_all();
    throw;
  }
  release_all();
}

void GeminiDDP::for_each_gathered(const std::function<void(size_t)>& fn) {
  for (size_t c = 0; c < chunks_.size(); ++c) {
    gather(c);
    wait_gathered(c);
    try {
      fn(c);
    } catch (...) {
      release(c);
      throw;
    }
    release(c);
  }
}

void GeminiDDP::refresh_chunk(size_t c) {
  at::NoGradGuard no_grad;
  Chunk& chunk = chunks_[c];
  const int64_t shard = chunk.layout.shard_numel;
  at::Tensor own = chunk.full.narrow(0, int64_t{dp_group_->rank()} * shard, shard);
  if (!chunk.placement.keep_gathered) chunk.shard.copy_(own);
  if (chunk.master.is_same(chunk.shard)) return;
  if (master_dtype_ == dtype_) {
    chunk.master.copy_(own);
    return;
  }
  // Keep exact masters where they still round to the parameter.
  at::Tensor own_here = own.to(chunk.master.device());
  at::Tensor same = chunk.master.to(dtype_).eq(own_here);
  chunk.master.copy_(at::where(same, chunk.master, own_here.to(master_dtype_)));
}

void GeminiDDP::refresh_from_params() {
  finish_host_updates();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    TORCH_CHECK(chunks_[c].state == Chunk::State::Gathered, "gemini: refresh_from_params needs every chunk gathered");
    refresh_chunk(c);
  }
}

void GeminiDDP::load_params(const std::function<at::Tensor(const std::string&)>& whole) {
  finish_host_updates();
  at::NoGradGuard no_grad;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    const bool was_released = chunk.state == Chunk::State::Released;
    wait_gathered(c);  // a prefetch in flight must not land on the loaded values
    alloc_storage(chunk.full);
    chunk.state = Chunk::State::Gathered;
    try {
      for (size_t k : chunk.layout.params) params_[k].second.copy_(whole(params_[k].first));
      refresh_chunk(c);
    } catch (...) {
      if (was_released) release(c);
      throw;
    }
    if (was_released) release(c);
  }
  for (auto& [name, p] : params_) {
    if (!p.requires_grad()) p.copy_(whole(name));
  }
}

}  // namespace colossus::zero::gemini
