// Finding the Hugging Face model directory (config.json + safetensors) behind
// a path a user gives: the directory itself, a training checkpoint step
// (step-00000100/model/), or a run / checkpoints directory whose `latest`
// file names the newest step.
#pragma once
#include <string>

namespace colossus::inference {

// Resolves `path`, trying in order:
//   PATH/config.json                  a model directory
//   PATH/model/config.json            a checkpoint step directory
//   PATH/latest                       a checkpoints directory: names a step dir (relative to PATH, or absolute)
//   PATH/checkpoints/latest           a run directory
// Returns the model directory. Throws CheckpointError naming what was looked
// for when none applies, or when `latest` names a step that is not there.
std::string resolve_model_dir(const std::string& path);

}  // namespace colossus::inference
