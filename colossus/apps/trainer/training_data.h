// The training run's data: the tokenizer named by the config, and the corpus
// tokenized once into token shards (train/ and eval/) under the cache
// directory. Rank 0 tokenizes while the others wait; a stamp file records what
// the shards were made from, so a rerun or a resume reuses them and a changed
// source or tokenizer re-tokenizes.
#pragma once
#include "colossus/apps/trainer/train_config.h"
#include "colossus/cluster/process_group.h"
#include "colossus/data/chat/chat_template.h"
#include "colossus/data/tokenizer.h"

#include <memory>
#include <optional>
#include <string>

namespace colossus::apps {

std::unique_ptr<data::Tokenizer> make_tokenizer(const DataSection& data);
// The chat template of data.tokenizer's directory, if it has one (see
// ChatTemplate::find_in_model_dir); none for the byte tokenizer.
std::optional<data::chat::ChatTemplate> find_chat_template(const DataSection& data);

struct TokenizedData {
  std::string train_dir;  // *.tokens of the training split
  std::string eval_dir;   // empty when there is no held-out split
  int64_t vocab_size = 0;
};

// Collective over `world`: every rank returns the same directories.
TokenizedData prepare_training_data(const TrainConfig& config, const data::Tokenizer& tokenizer,
                                    cluster::ProcessGroup& world);

// Puts the tokenizer's files into a model directory, so the checkpoint loads
// with its tokenizer (colossus generate, transformers' AutoTokenizer).
void save_tokenizer_files(const DataSection& data, const std::string& model_dir);

}  // namespace colossus::apps
