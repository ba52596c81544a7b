// Scalar summaries in TensorBoard's event-file format, encoded by hand (TFRecord
// framing + the few Event/Summary protobuf fields scalars need): no TF, no protobuf.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace colossus::metrics {

struct TensorBoardOptions {
  // Appended to the file name events.out.tfevents.<unix time>.<host>.
  std::string filename_suffix;
  // Resuming from a checkpoint at this step: the file starts with a SessionLog
  // START event at resume_step + 1, on which TensorBoard discards the points the
  // interrupted run logged after resume_step (its files stay in the folder).
  std::optional<int64_t> resume_step;
};

class TensorBoardWriter {
 public:
  // Creates `log_dir` and a new event file in it, whose first record is the
  // file_version event ("brain.Event:2").
  explicit TensorBoardWriter(std::filesystem::path log_dir, TensorBoardOptions options = {});
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar (stored as float32, as TensorBoard does) at `step`; wall_time in
  // seconds since the epoch defaults to now. Flushed, so TensorBoard sees it live.
  void add_scalar(std::string_view tag, double value, int64_t step, std::optional<double> wall_time = std::nullopt);
  // Several scalars of one step in one event, e.g. {{"train/loss", 2.3}, {"train/lr", 3e-4}}.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                   std::optional<double> wall_time = std::nullopt);

  const std::filesystem::path& file_path() const { return file_path_; }

 private:
  void write_event(const std::string& event_bytes);

  std::filesystem::path file_path_;
  std::FILE* file_ = nullptr;
};

}  // namespace colossus::metrics
