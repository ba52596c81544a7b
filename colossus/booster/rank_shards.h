// Per-rank sharded checkpoints (SaveOptions::shard) for plugins whose state is
// sharded over ranks (ZeRO, Gemini): each writing rank saves the whole
// tensors it owns as its own file of a Hugging Face sharded layout
// (`<prefix>-0000r-of-0000N.safetensors`), and rank 0 publishes
// `<prefix>.safetensors.index.json` once every file is on disk. No rank
// gathers the whole model or optimizer state, and the directory is still an
// ordinary HF checkpoint: any rank count, DDP and transformers load it.
// All ranks must see one filesystem (as loading with other ranks needs).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/process_group.h"

namespace colossus::booster {

struct RankShard {
  int file_rank = 0;   // which file of file_count this rank writes (0-based)
  int file_count = 1;  // writing ranks (replicas of a shard do not write)
  bool writes = true;  // false: a replica of another rank's shard
};

// Collective over `group` (whose rank 0 must write file 0). Each writer saves
// `mine` atomically (temp + rename) under a name the live index of `dir` does
// not use, so a crash mid-save leaves the previous checkpoint loadable; after
// every rank succeeded, rank 0 writes the index from the files' headers, then
// removes a single `<prefix>.safetensors` (which would shadow the index) and
// stale shards. `metadata` goes into every file ("format": "pt" added).
void save_rank_shards(cluster::ProcessGroup& group, const RankShard& shard, const std::string& dir,
                      const std::string& prefix, const checkpoint::NamedTensors& mine,
                      std::map<std::string, std::string> metadata, const std::string& what);

// The writing rank of each of `tensors` when every rank holds them whole:
// contiguous runs of about equal bytes, in order, one run per rank.
std::vector<int> writer_ranks_by_bytes(const checkpoint::NamedTensors& tensors, int ranks);

}  // namespace colossus::booster
