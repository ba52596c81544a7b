// What the trainer's end-to-end tests share: a Python oracle run once per MPI
// job (by rank 0, into the job's scratch area) and fresh run directories.
#pragma once
#include <filesystem>
#include <string>

namespace colossus::testing {

// Runs `python script OUT` with OUT = job_scratch_dir(area) / name unless
// OUT / done_file already exists (an earlier test of this job made it);
// every rank waits, and all throw with the oracle's output if it failed.
// `env` prefixes the command ("TORCHDYNAMO_DISABLE=1").
std::filesystem::path run_oracle_once(const std::string& area, const std::string& name, const std::string& python,
                                      const std::string& script, const std::string& done_file,
                                      const std::string& env = "");

// job_scratch_dir(area) / name, emptied by rank 0; every rank waits.
std::filesystem::path fresh_job_dir(const std::string& area, const std::string& name);

}  // namespace colossus::testing
