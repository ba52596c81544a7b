// Serving one engine over tensor-parallel ranks: before each step, rank 0's
// EngineLoop broadcasts over the tp group what changed (new requests with
// their resolved options and seeds, aborts, whether to step, stop); every
// other rank applies the same to its own engine in follow_steps(), so all
// engines hold the same requests in the same order and step in lockstep.
// Only rank 0 serves HTTP and hands text to clients.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/inference/engine/engine.h"

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::inference::serving {

// One submission as every rank adds it: all its prompts or none.
struct StepSubmission {
  std::vector<std::vector<int64_t>> prompts;  // token ids
  std::vector<RequestOptions> options;        // one per prompt; sampling and seed resolved by rank 0
  // The engine ids rank 0 got for the prompts (empty: its engine refused
  // the submission). Every rank's engine must give the same.
  std::vector<int64_t> ids;
};

// What rank 0 tells the other ranks before a step (or, idle, once a second,
// so that no collective waits past its timeout).
struct StepCommands {
  std::vector<StepSubmission> submissions;  // in admission order, before the aborts
  std::vector<int64_t> aborts;              // engine request ids, in order
  bool step = false;                        // every rank then calls step() once
  bool stop = false;                        // the last message: the other ranks return
};

// Bytes on the wire (host byte order: the ranks share one machine's build).
std::string encode_step_commands(const StepCommands& commands);
// Throws DistError on bytes that are not an encoding.
StepCommands decode_step_commands(const std::string& bytes);

// StepCommands over a tp group (any size; rank 0 sends): the length, then a
// broadcast of the bytes, on the group's device (the GPU under NCCL). A
// waiting rank polls for the length and sleeps between polls, so an idle
// server's other ranks take no core: under MPI the length comes as a message
// from rank 0 (a blocked MPI broadcast spins inside MPI), under NCCL as a
// broadcast whose completion event is polled.
class StepBroadcast {
 public:
  explicit StepBroadcast(cluster::ProcessGroupPtr group);
  void send(const StepCommands& commands);  // rank 0
  StepCommands receive();                   // the other ranks; blocks until rank 0 sends
  const cluster::ProcessGroupPtr& group() const { return group_; }

 private:
  cluster::ProcessGroupPtr group_;
  bool length_by_message_;  // MPI: point-to-point lengths; else a broadcast
};

// A submission's prompts added all or nothing: their engine ids, or, when the
// engine refused one, the refusal's message (nothing of the submission left
// queued). Rank 0's EngineLoop and follow_steps admit through this one
// function, so their engines refuse alike.
struct Admission {
  std::vector<int64_t> ids;
  std::string refusal;  // empty when admitted
};
Admission admit_submission(InferenceEngine& engine, std::vector<std::vector<int64_t>> prompts,
                           const std::vector<RequestOptions>& options);

// A tp rank other than 0: receives rank 0's commands from `steps`, applies
// them to `engine` (sharded over the same group) and steps with it, until
// rank 0 stops. Throws DistError when this engine admits differently than
// rank 0's.
void follow_steps(InferenceEngine& engine, StepBroadcast& steps);

}  // namespace colossus::inference::serving
