// Internal to the engine's files: the text of a request's generated tokens,
// kept for stop strings and streamed text.
#pragma once
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/text_stream.h"

#include <cstddef>
#include <string>

namespace colossus::inference {

// Text of a request's generated tokens, for stop strings and streamed text.
struct InferenceEngine::TextState {
  explicit TextState(const data::Tokenizer& tokenizer) : stream(tokenizer) {}
  TextStream stream;
  std::string text;     // final text so far
  size_t emitted = 0;   // bytes of text handed out
  size_t holdback = 0;  // longest stop string - 1: text that may still become a stop string
};

}  // namespace colossus::inference
