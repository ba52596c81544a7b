// The SFT examples of one data-parallel rank, streamed from a JSONL source:
// records dealt round-robin over the ranks by their index, in file order or
// in a seeded permutation drawn anew each epoch, tokenized ahead on worker
// threads, examples with no trained token dropped (and counted, as TRL drops
// them), epochs by starting the source over, and a position that resumes at
// exactly the next example whatever the thread count.
#pragma once
#include "colossus/data/jsonl_source.h"
#include "colossus/data/sft_examples.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::data {

struct SftStreamOptions {
  int64_t rank = 0;       // this rank takes the records whose index % world == rank
  int64_t world = 1;      // data-parallel ranks
  int threads = 1;        // tokenizing threads (1: on the caller's thread)
  int64_t lookahead = 64; // records tokenized ahead of next()
  bool loop = true;       // after the last record, start over (the next epoch)
  // Set: each epoch reads the records in a permutation drawn from (seed,
  // epoch), the same on every rank and after a resume; the source is indexed
  // (one offset per record) when the stream is made. Unset: file order.
  std::optional<uint64_t> shuffle_seed;
  void validate() const;
};

// Where a rank's stream stands: `source` is the JSONL position before the
// next record this rank takes, `record_index` that record's index (in the
// epoch's permutation when shuffling), `epoch`
// the pass over the source it belongs to, `dropped` the examples dropped so
// far. The same for any thread count.
struct SftStreamPosition {
  JsonlPosition source;
  int64_t record_index = 0;
  int64_t epoch = 0;
  int64_t dropped = 0;
  nlohmann::json to_json() const;
  static SftStreamPosition from_json(const nlohmann::json& j);
  bool operator==(const SftStreamPosition&) const = default;
};

class SftExampleStream {
 public:
  // What `builder` refers to (the tokenizer, the chat template) must outlive the stream.
  SftExampleStream(const std::string& source, const JsonlSourceOptions& source_options, SftExampleBuilder builder,
                   const SftStreamOptions& options);
  ~SftExampleStream();
  SftExampleStream(const SftExampleStream&) = delete;
  SftExampleStream& operator=(const SftExampleStream&) = delete;

  // This rank's next example with a trained token. nullopt at the end when
  // !loop. A bad record throws as the source or the builder does (FILE:LINE
  // from the source; the builder's refusal names what SFT cannot train). A
  // whole pass that gives this rank no example: ConfigError.
  std::optional<SftExample> next();

  SftStreamPosition position() const;
  // Continues so that next() returns the example `position` was taken before.
  void seek(const SftStreamPosition& position);

  int64_t dropped() const { return dropped_; }
  const JsonlSource& source() const { return source_; }

 private:
  struct Pending {
    JsonlPosition before;
    int64_t record_index = 0;
    int64_t epoch = 0;
    std::future<SftExample> example;
  };
  class Workers;

  void fill();
  void clear();
  // Shuffling: the source position of the record_index-th record of `epoch`'s order.
  const JsonlPosition& shuffled_start(int64_t epoch, int64_t record_index);

  JsonlSource source_;
  SftExampleBuilder builder_;
  SftStreamOptions options_;
  JsonlPosition start_;
  std::unique_ptr<Workers> workers_;
  std::deque<Pending> pending_;
  int64_t record_index_ = 0;  // of the next record the source gives
  int64_t epoch_ = 0;         // of the next record the source gives
  int64_t dropped_ = 0;
  int64_t taken_this_epoch_ = 0;  // examples returned since the epoch of the last one began
  int64_t last_epoch_ = -1;
  int64_t mine_this_epoch_ = 0;  // records of the source's current pass dealt to this rank
  bool exhausted_ = false;
  std::vector<JsonlPosition> record_starts_;  // shuffling: where each record of the source starts
  std::vector<int64_t> order_;                // shuffling: order_epoch_'s permutation of the records
  int64_t order_epoch_ = -1;
};

// A permutation of [0, n) drawn from (seed, epoch): Fisher-Yates over a
// 64-bit Mersenne twister with unbiased bounded draws, so the order is the
// same on every platform and after a resume.
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace colossus::data
