#include "train/eval_text.h"
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>
#include "data/tokenizer.h"
#include "src/errors.h"
#include "train/checkpoint.h"
#include "train/load_model.h"

namespace flashgpt {

TextEvalResult evaluate_text(const TextEvalOptions& o) {
  std::ifstream f(o.text_file, std::ios::binary);
  if (!f) fail_input("--text: cannot read '", o.text_file, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  Tokenizer tok(o.vocab.empty() ? Tokenizer::default_dir() : o.vocab);
  std::vector<int32_t> ids = {Tokenizer::kEndOfText};
  const std::vector<int32_t> body = tok.encode_with_special(text);
  ids.insert(ids.end(), body.begin(), body.end());
  const int64_t N = int64_t(body.size());
  if (N == 0) fail_input("--text: '", o.text_file, "' has no tokens");

  const Config ck = load_checkpoint_config(resolve_checkpoint(o.checkpoint));
  const int max_T = ck.model.max_seq_len;
  if (ck.model.vocab_size <= Tokenizer::kEndOfText)
    fail_input("eval --text needs a model with GPT-2's vocabulary (50257); this one has ", ck.model.vocab_size);
  const int T = o.seq_len > 0 ? o.seq_len : max_T;
  if (T < 1 || T > max_T) fail_input("--seq-len ", T, " is outside the model's context [1, ", max_T, "]");
  const int S = o.stride > 0 ? o.stride : std::max(1, T / 2);
  if (S > T) fail_input("--stride ", S, " is larger than --seq-len ", T, " (tokens would be skipped)");

  // Windows: start k·S, inputs ids[start, start+T), targets ids[start+1, start+T+1);
  // scored targets are those past the previous window's end.
  struct Window { int64_t start, first_scored; };
  std::vector<Window> windows;
  int64_t scored_end = 0;  // targets ids[1 .. scored_end] are done
  for (int64_t start = 0; scored_end < N; start += S) {
    windows.push_back({start, scored_end + 1});
    scored_end = std::min<int64_t>(N, start + T);
  }

  const bool gpu = o.device == "cuda" || (o.device == "auto" && cuda_available());
  const int B = std::min<int64_t>(o.batch_size > 0 ? o.batch_size : gpu ? 8 : 1, int64_t(windows.size()));
  LoadedModel lm = load_for_inference(o.checkpoint, o.device, o.precision, B, T);
  GPT2& model = *lm.model;
  const int MB = model.B();

  std::vector<int32_t> in(size_t(MB) * T), tg(in.size());
  double sum = 0;
  int64_t count = 0;
  for (size_t w0 = 0; w0 < windows.size(); w0 += size_t(MB)) {
    std::fill(in.begin(), in.end(), 0);
    std::fill(tg.begin(), tg.end(), -1);
    int64_t batch_count = 0;
    for (int b = 0; b < MB && w0 + size_t(b) < windows.size(); ++b) {
      const Window& w = windows[w0 + size_t(b)];
      for (int t = 0; t < T && w.start + t < N; ++t) {  // ids has N + 1 entries
        const int64_t target = w.start + t + 1;
        in[size_t(b) * T + size_t(t)] = ids[size_t(w.start + t)];
        if (target >= w.first_scored) {
          tg[size_t(b) * T + size_t(t)] = ids[size_t(target)];
          ++batch_count;
        }
      }
    }
    model.set_batch(in.data(), tg.data());
    model.forward(0.0f);
    sum += model.last_loss() * double(batch_count);  // forward's mean is over the scored targets
    count += batch_count;
  }
  FG_ASSERT(count == N, "scored ", count, " tokens of ", N);
  TextEvalResult r;
  r.loss = sum / double(count);
  r.perplexity = std::exp(r.loss);
  r.tokens = long(count);
  r.bytes = long(text.size());
  r.bits_per_byte = sum / (std::log(2.0) * double(text.size()));
  r.windows = long(windows.size());
  r.seq_len = T;
  r.stride = S;
  return r;
}

}  // namespace flashgpt
