// See tensor_parallel_steps.h.
#include "colossus/inference/serving/tensor_parallel_steps.h"

#include "colossus/core/errors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

namespace colossus::inference::serving {

namespace {

// Every field of RequestOptions and SamplingParams travels (writer/reader
// below); a new field must be added there, then these sizes.
static_assert(sizeof(SamplingParams) == 64, "SamplingParams changed: send its new field to the other tp ranks");
static_assert(sizeof(RequestOptions) == 184, "RequestOptions changed: send its new field to the other tp ranks");

class Writer {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  template <typename T>
  void put(const std::optional<T>& value) {
    put<bool>(value.has_value());
    if (value) put(*value);
  }
  void put(const std::string& text) {
    put<uint64_t>(text.size());
    bytes_ += text;
  }
  void put(const std::vector<int64_t>& values) {
    put<uint64_t>(values.size());
    bytes_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  }
  void put(const SamplingParams& s) {
    put(s.do_sample);
    put(s.temperature);
    put(s.top_k);
    put(s.top_p);
    put(s.repetition_penalty);
    put(s.seed);
    put(s.presence_penalty);
    put(s.frequency_penalty);
  }
  void put(const RequestOptions& o) {
    put(o.max_new_tokens);
    put(o.sampling);
    put(o.no_repeat_ngram_size);
    put(o.ignore_eos);
    put(o.beam_width);
    put<uint64_t>(o.stop.size());
    for (const std::string& s : o.stop) put(s);
    put(o.logprobs);
    put(o.prompt_logprobs);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  template <typename T>
  std::optional<T> get_optional() {
    if (!get<bool>()) return std::nullopt;
    if constexpr (std::is_same_v<T, SamplingParams>) return sampling();
    else return get<T>();
  }
  std::string string() {
    const auto size = count(1);
    return std::string(take(size), size);
  }
  std::vector<int64_t> ids() {
    const auto size = count(sizeof(int64_t));
    std::vector<int64_t> values(size);
    if (size > 0) std::memcpy(values.data(), take(size * sizeof(int64_t)), size * sizeof(int64_t));
    return values;
  }
  SamplingParams sampling() {
    SamplingParams s;
    s.do_sample = get<bool>();
    s.temperature = get<double>();
    s.top_k = get<int64_t>();
    s.top_p = get<double>();
    s.repetition_penalty = get<double>();
    s.seed = get<uint64_t>();
    s.presence_penalty = get<double>();
    s.frequency_penalty = get<double>();
    return s;
  }
  RequestOptions options() {
    RequestOptions o;
    o.max_new_tokens = get_optional<int64_t>();
    o.sampling = get_optional<SamplingParams>();
    o.no_repeat_ngram_size = get_optional<int64_t>();
    o.ignore_eos = get_optional<bool>();
    o.beam_width = get_optional<int64_t>();
    o.stop.resize(count(sizeof(uint64_t)));
    for (std::string& s : o.stop) s = string();
    o.logprobs = get_optional<int64_t>();
    o.prompt_logprobs = get_optional<int64_t>();
    return o;
  }
  // A length prefix, checked against the bytes left (each item at least item_bytes).
  size_t count(size_t item_bytes) {
    const auto n = get<uint64_t>();
    if (n > (bytes_.size() - offset_) / item_bytes) fail();
    return static_cast<size_t>(n);
  }
  bool done() const { return offset_ == bytes_.size(); }

 private:
  const char* take(size_t size) {
    if (size > bytes_.size() - offset_) fail();
    const char* at = bytes_.data() + offset_;
    offset_ += size;
    return at;
  }
  [[noreturn]] void fail() const {
    throw DistError(fmt::format("the step commands from tp rank 0 are cut or corrupt ({} bytes, read up to {})",
                                bytes_.size(), offset_));
  }
  const std::string& bytes_;
  size_t offset_ = 0;
};

// The tag of the lengths rank 0 sends (nothing else in a server sends point to point).
constexpr int kStepTag = 0x5e7;

// Waits for `work` without holding a core: polls it, at first at once (a
// busy server's next step comes within a millisecond), then sleeping up to
// 2 ms between polls (an idle one).
void wait_sleeping(cluster::Work work) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  while (!work.is_completed()) {
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  work.wait();  // rethrows a failure; orders this stream after a NCCL broadcast
}

}  // namespace

std::string encode_step_commands(const StepCommands& commands) {
  Writer w;
  w.put<uint64_t>(commands.submissions.size());
  for (const StepSubmission& s : commands.submissions) {
    TORCH_CHECK(s.options.size() == s.prompts.size(), "a submission of ", s.prompts.size(), " prompts has ",
                s.options.size(), " options");
    w.put<uint64_t>(s.prompts.size());
    for (size_t i = 0; i < s.prompts.size(); ++i) {
      w.put(s.prompts[i]);
      w.put(s.options[i]);
    }
    w.put(s.ids);
  }
  w.put(commands.aborts);
  w.put(commands.step);
  w.put(commands.stop);
  return w.take();
}

StepCommands decode_step_commands(const std::string& bytes) {
  Reader r(bytes);
  StepCommands commands;
  commands.submissions.resize(r.count(1));
  for (StepSubmission& s : commands.submissions) {
    const size_t prompts = r.count(1);
    for (size_t i = 0; i < prompts; ++i) {
      s.prompts.push_back(r.ids());
      s.options.push_back(r.options());
    }
    s.ids = r.ids();
  }
  commands.aborts = r.ids();
  commands.step = r.get<bool>();
  commands.stop = r.get<bool>();
  if (!r.done()) throw DistError(fmt::format("the step commands from tp rank 0 carry {} trailing bytes", bytes.size()));
  return commands;
}

StepBroadcast::StepBroadcast(cluster::ProcessGroupPtr group)
    : group_(std::move(group)), length_by_message_(group_ != nullptr && group_->backend_name() == "mpi") {
  TORCH_CHECK(group_ != nullptr, "StepBroadcast needs a process group");
}

void StepBroadcast::send(const StepCommands& commands) {
  TORCH_CHECK(group_->rank() == 0, "only tp rank 0 sends step commands; this is rank ", group_->rank());
  std::string bytes = encode_step_commands(commands);
  const c10::Device device = group_->device();
  const at::Tensor length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong).to(device);
  if (length_by_message_) {
    std::vector<cluster::Work> sends;
    for (int rank = 1; rank < group_->size(); ++rank) sends.push_back(group_->send(length, rank, kStepTag));
    for (cluster::Work& work : sends) work.wait();
  } else {
    group_->broadcast(length, 0).wait();
  }
  const at::Tensor payload =
      at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
  group_->broadcast(payload.to(device), 0).wait();
}

StepCommands StepBroadcast::receive() {
  const c10::Device device = group_->device();
  at::Tensor length = at::empty({1}, at::TensorOptions().dtype(at::kLong).device(device));
  wait_sleeping(length_by_message_ ? group_->recv(length, 0, kStepTag) : group_->broadcast(length, 0));
  const int64_t size = length.item<int64_t>();
  at::Tensor payload = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(device));
  group_->broadcast(payload, 0).wait();
  payload = payload.cpu();
  return decode_step_commands(std::string(reinterpret_cast<const char*>(payload.data_ptr<uint8_t>()),
                                          static_cast<size_t>(size)));
}

Admission admit_submission(InferenceEngine& engine, std::vector<std::vector<int64_t>> prompts,
                           const std::vector<RequestOptions>& options) {
  TORCH_CHECK(options.size() == prompts.size(), "admit_submission: ", options.size(), " options for ", prompts.size(),
              " prompts");
  Admission admission;
  try {
    for (size_t i = 0; i < prompts.size(); ++i) {
      admission.ids.push_back(engine.add_request(std::move(prompts[i]), options[i]));
    }
  } catch (const std::exception& e) {
    // All or nothing: a submission the engine refuses leaves nothing behind.
    for (int64_t id : admission.ids) engine.abort_request(id);
    admission.ids.clear();
    admission.refusal = e.what();
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
      admission.refusal = c10_error->what_without_backtrace();
    }
    if (admission.refusal.empty()) admission.refusal = "the engine refused the request";
  }
  return admission;
}

void follow_steps(InferenceEngine& engine, StepBroadcast& steps) {
  const int rank = steps.group()->rank();
  for (;;) {
    StepCommands commands = steps.receive();
    for (StepSubmission& s : commands.submissions) {
      const Admission admission = admit_submission(engine, std::move(s.prompts), s.options);
      if (admission.ids != s.ids) {
        throw DistError(fmt::format("tp rank {}'s engine {} a submission that rank 0's {} (ids [{}] against [{}]){}; "
                                    "the ranks no longer hold the same requests",
                                    rank, admission.ids.empty() ? "refused" : "admitted",
                                    s.ids.empty() ? "refused" : "admitted", fmt::join(admission.ids, ", "),
                                    fmt::join(s.ids, ", "),
                                    admission.refusal.empty() ? "" : ": " + admission.refusal));
      }
    }
    for (int64_t id : commands.aborts) engine.abort_request(id);
    if (commands.step) engine.step();  // only rank 0 hands outputs to clients
    if (commands.stop) return;
  }
}

}  // namespace colossus::inference::serving
