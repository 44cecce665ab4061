// `flashgpt eval CKPT --text FILE`: perplexity of raw text, tokenised on the fly.
//
// Convention (sliding window). The file is one document: <|endoftext|> x_1 … x_N (as in
// training shards, where every document starts with <|endoftext|>; "<|endoftext|>"
// inside the text is the special token), and each of x_1 … x_N is scored exactly once.
// Windows of T tokens start every S tokens (S = stride <= T): window k reads positions
// [k·S, k·S + T) and predicts the next token at each; the first window scores all its
// predictions, each later one only its last S (the rest were scored by the window
// before); the last window is cut at the end of the text. So a token is predicted from
// at least T − S + 1 tokens of context (or all the text before it, when that is
// shorter) and at most T. S = T: disjoint windows (fast, least context); S = 1: every
// token with a full window of T tokens of context (slow). Loss = mean negative
// log-likelihood (nats) over x_1 … x_N; perplexity = exp(loss); bits per byte =
// loss·N / (ln 2 · bytes of text).
#pragma once
#include <string>

namespace flashgpt {

struct TextEvalOptions {
  std::string checkpoint;
  std::string text_file;
  int seq_len = 0;        // T; 0: the model's context (max_seq_len)
  int stride = 0;         // S; 0: T / 2
  int batch_size = 0;     // windows per forward; 0: 8 on a GPU, 1 on the CPU
  std::string device = "auto";
  std::string precision;  // "": the checkpoint's
  std::string vocab;      // tokenizer dir ("" = default)
};

struct TextEvalResult {
  double loss = 0, perplexity = 0, bits_per_byte = 0;
  long tokens = 0;   // tokens scored (N)
  long bytes = 0;    // bytes of text
  long windows = 0;
  int seq_len = 0, stride = 0;
};

TextEvalResult evaluate_text(const TextEvalOptions& o);

}  // namespace flashgpt
