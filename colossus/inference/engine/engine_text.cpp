// Stop conditions of a request after each new token: eos, length, and stop
// strings over its decoded text, which is streamed out past the part that
// may still become a stop string.
#include "colossus/inference/engine/engine.h"

#include "colossus/inference/engine/text_state.h"

namespace colossus::inference {

void InferenceEngine::check_stop(Sequence& seq, RequestOutput& out) {
  const int64_t token = seq.tokens.back();
  if (seq.eos_id && token == *seq.eos_id) seq.finish_reason = FinishReason::Stop;
  else if (seq.num_generated() >= seq.max_new_tokens) seq.finish_reason = FinishReason::Length;

  auto it = texts_.find(seq.id);
  if (it == texts_.end()) return;
  TextState& text = *it->second;
  text.text += text.stream.push(token);
  if (seq.finished()) text.text += text.stream.finish();
  for (const auto& stop : seq.stop) {
    // Only the tail can hold a new match: the last token's text plus the stop string's length.
    const size_t from = text.emitted;
    const size_t at = text.text.find(stop, from);
    if (at != std::string::npos) {
      text.text.resize(at);  // OpenAI's convention: the stop string is not returned
      seq.finish_reason = FinishReason::Stop;
    }
  }
  const size_t final_end = seq.finished() ? text.text.size()
                                          : (text.text.size() > text.holdback ? text.text.size() - text.holdback : 0);
  if (final_end > text.emitted) {
    out.new_text += text.text.substr(text.emitted, final_end - text.emitted);
    text.emitted = final_end;
  }
}

}  // namespace colossus::inference
