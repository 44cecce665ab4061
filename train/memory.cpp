// `flashgpt memory`: the device memory of a training run, per category, for a sweep of
// context lengths × attention algorithms × recompute policies (train/memory_plan.h).
// Without --measure it needs no GPU. With --measure, each point runs real training
// steps on the GPU: device memory in use (cudaMemGetInfo, less what was in use before
// the point's context and model existed) next to the plan, tokens/s and MFU; a point
// that does not fit is recorded as out of memory (by the pre-flight check, or by a
// failed allocation) and the sweep goes on. --csv, --json and --plot (SVG) write the
// same points.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/commands.h"
#include "src/config.h"
#include "src/errors.h"
#include "src/json_fields.h"
#include "train/backend.h"
#include "train/memory_plan.h"
#include "train/svg_plot.h"

namespace flashgpt {
namespace {

struct MemoryOptions {
  std::string config = "configs/gpt2-124m.yaml";
  std::vector<std::string> sets;
  std::vector<std::string> seq;          // context lengths (1024, 4K, 1M); empty: train.seq_len
  int64_t tokens_per_step = 0;           // B = max(1, this / T); 0: train.batch_size
  std::vector<std::string> attention;    // empty: model.attention
  std::vector<std::string> recompute;    // empty: train.recompute
  std::string device = "cuda";           // what the plan is for
  int world = 1, zero = 1;
  bool measure = false;
  int warmup = 1, steps = 1;
  std::string measure_max_seq;           // longer points: plan only
  std::vector<std::string> measured_files;  // earlier --json output (and PyTorch's) to merge
  bool json = false;
  std::string csv, plot;
  double gpu_gib = 0;                    // the plot's capacity line; 0: the GPU's, or an H200's
};

// An H200's memory as cudaMemGetInfo reports it (143,771 MiB): the capacity line of a
// plot made without a GPU.
constexpr double kH200GiB = 143771.0 / 1024.0;
constexpr double kGiB = double(size_t(1) << 30);

int64_t parse_count(const std::string& s, const char* what) {
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    fail_input(what, ": expected a positive integer (optionally with K or M), got '", s, "'");
  }
  std::string suffix = s.substr(pos);
  if (suffix == "K" || suffix == "k") v <<= 10;
  else if (suffix == "M" || suffix == "m") v <<= 20;
  else if (!suffix.empty()) fail_input(what, ": expected a positive integer (optionally with K or M), got '", s, "'");
  if (v < 1 || v > (int64_t(1) << 30)) fail_input(what, ": ", s, " is out of range [1, 1G]");
  return v;
}

struct Measured {
  std::string status;         // "ok", "OOM (plan)", "OOM (cudaMalloc)", "error"
  double bytes = 0;           // device memory in use for the point
  double step_ms = 0, tokens_per_s = 0, mfu = 0;
  std::string detail;         // the pre-flight sentence or the error
  std::string gpu;            // the GPU's name, and its memory in bytes
  double gpu_bytes = 0;
};

struct Point {
  Config cfg;  // this point's config (seq_len, batch_size, attention, recompute)
  MemoryPlan plan;
  bool measure = false;  // measured (now, or read back with --measured)
  Measured m;
};

// A measurement without a plan of ours, read with --measured (e.g. PyTorch's, from
// scripts/memory_torch.py): plotted and listed beside ours.
struct External {
  int64_t T = 0, B = 0;
  std::string series;  // "<attention>, <recompute>" as in the JSON
  Measured m;
};

// Reads the measured points of `file` (the --json output of an earlier --measure run, or
// scripts/memory_torch.py's): those matching a planned point are attached to it, the
// others are returned.
std::vector<External> merge_measured(const std::string& file, std::vector<Point>& pts) {
  std::ifstream f(file);
  if (!f) fail_input("--measured: cannot read '", file, "'");
  nlohmann::json all;
  try {
    all = parse_json("--measured: '" + file + "'", f);
  } catch (const nlohmann::json::exception& e) {
    fail_input("--measured: '", file, "' is not JSON: ", e.what());
  }
  if (!all.is_array()) fail_input("--measured: '", file, "' must hold a JSON array of points");
  std::vector<External> ext;
  for (const auto& j : all) {
    if (!j.is_object() || !j.contains("status")) continue;  // a plan-only point
    Measured m;
    try {
      m.status = j.at("status").get<std::string>();
      m.bytes = j.value("measured_bytes", 0.0);
      m.step_ms = j.value("step_ms", 0.0);
      m.tokens_per_s = j.value("tokens_per_s", 0.0);
      m.mfu = j.value("mfu", 0.0);
      m.detail = j.value("detail", std::string());
      m.gpu = j.value("gpu", std::string());
      m.gpu_bytes = j.value("gpu_total_bytes", 0.0);
      const int64_t T = j.at("T").get<int64_t>(), B = j.at("B").get<int64_t>();
      const std::string a = j.at("attention").get<std::string>(), r = j.at("recompute").get<std::string>();
      bool matched = false;
      for (auto& p : pts)
        if (p.plan.T == T && p.plan.B == B && p.plan.attention == a && p.plan.recompute == r &&
            j.value("position", p.plan.position) == p.plan.position) {
          p.measure = true;
          p.m = m;
          matched = true;
        }
      if (!matched) ext.push_back({T, B, a + ", " + r, m});
    } catch (const nlohmann::json::exception& e) {
      fail_input("--measured: a point of '", file, "' lacks a field: ", e.what());
    }
  }
  return ext;
}

DType plan_dtype(const Config& c, Device dev) {
  const std::string& p = c.train.precision;
  if (dev == Device::cuda) {
    if (p == "fp64") fail_input("train.precision fp64 is only supported on the CPU (use --device cpu)");
    return p == "fp32" ? DType::f32 : DType::bf16;
  }
  if (p == "bf16") fail_input("train.precision bf16 needs a GPU (use --device cuda)");
  return p == "fp64" ? DType::f64 : DType::f32;
}

bool is_oom(const std::exception& e) {
  const std::string w = e.what();
  return w.find("out of GPU memory") != std::string::npos ||
         w.find("cudaErrorMemoryAllocation") != std::string::npos;
}

// GPT-2's initialisation of 124M weights on the host takes seconds, so the weights are
// drawn once and later models get a copy, tensor by tensor by name; a larger position
// table repeats the drawn rows.
struct InitCache {
  DType dtype = DType::f32;
  std::map<std::string, std::vector<char>> tensors;  // raw, activation dtype
};

void init_params(GPT2& model, Ops& ops, InitCache& cache, uint64_t seed) {
  const size_t es = dtype_size(model.dtype());
  std::vector<char> raw(model.params().nbytes());
  bool cached = !cache.tensors.empty() && cache.dtype == model.dtype();
  for (const ParamInfo& p : model.param_list()) cached = cached && cache.tensors.count(p.name);
  if (!cached) {
    model.init_random(seed);
    ops.to_host(raw.data(), model.params());
    cache.dtype = model.dtype();
    cache.tensors.clear();
    for (const ParamInfo& p : model.param_list())
      cache.tensors[p.name].assign(raw.begin() + int64_t(p.offset * es), raw.begin() + int64_t((p.offset + p.numel()) * es));
    return;
  }
  for (const ParamInfo& p : model.param_list()) {
    const std::vector<char>& src = cache.tensors.at(p.name);
    char* dst = raw.data() + p.offset * es;
    const size_t want = size_t(p.numel()) * es;
    for (size_t done = 0; done < want; done += std::min(src.size(), want - done))
      std::memcpy(dst + done, src.data(), std::min(src.size(), want - done));
  }
  ops.from_host(model.params(), raw.data());
}

// One point on the GPU: fresh context and model, `warmup` + `steps` training steps on
// random tokens.
Measured measure_point(const Point& pt, const MemoryOptions& o, InitCache& init) {
  const Config& c = pt.cfg;
  const int B = c.train.batch_size, T = c.train.seq_len;
  Measured r;
  const auto [free_before, total_before] = cuda_memory_info();
  const size_t used_before = total_before - free_before;
  Backend be = make_backend("cuda", c.train.precision);
  r.detail = memory_shortfall(c, {Device::cuda, be.dtype, o.world, o.zero}, be.device_memory_free());
  if (!r.detail.empty()) {
    r.status = "OOM (plan)";
    return r;
  }
  try {
    GPT2 model(model_config(c), *be.ops, be.dtype, B, T, model_options(c));
    init_params(model, *be.ops, init, c.train.seed);
    AdamW opt(model, adamw_config(c));
    std::mt19937_64 rng(c.train.seed);
    std::uniform_int_distribution<int32_t> tok(0, c.model.vocab_size - 1);
    std::vector<int32_t> in(size_t(B) * T), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = tok(rng), tg[i] = tok(rng);
    std::vector<double> ms;
    for (int s = 0; s < o.warmup + o.steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      model.set_batch(in.data(), tg.data());
      model.zero_grad();
      model.forward(1.0f / float(int64_t(B) * T));
      model.backward();
      opt.step(c.train.lr, opt.grad_norm(), uint32_t(s));
      be.ops->synchronize();
      if (s >= o.warmup)
        ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // Nothing is allocated or freed inside a step after the first, so what is in use
    // now is the peak.
    r.bytes = double(be.device_memory_used()) - double(used_before);
    std::sort(ms.begin(), ms.end());
    r.step_ms = ms[ms.size() / 2];
    r.tokens_per_s = double(B) * T / (r.step_ms / 1e3);
    if (be.peak_tflops > 0) r.mfu = r.tokens_per_s * model.flops_per_token() / 1e12 / be.peak_tflops;
    r.status = "ok";
    r.gpu = be.gpu_name;
    r.gpu_bytes = double(be.device_memory_total());
  } catch (const std::exception& e) {
    // Recorded, and the sweep goes on (a sticky CUDA error would fail the next points too).
    r.status = is_oom(e) ? "OOM (cudaMalloc)" : "error";
    r.detail = e.what();
  }
  return r;
}

std::string short_kind(const std::string& kind) {
  static const std::map<std::string, std::string> names = {
      {"layernorm outputs", "LN out"}, {"layernorm statistics", "LN stat"}, {"QKV", "QKV"},
      {"attention output", "att O"},   {"attention LSE", "LSE"},           {"attention P (naive)", "P naive"},
      {"MLP pre-GELU", "MLP pre"},     {"MLP GELU output", "GELU out"},    {"residual stream", "resid"},
      {"tokens, targets, losses", "tokens"}, {"LM-head chunk", "head"},
      {"scratch (projections, gradients)", "scratch"}};
  auto it = names.find(kind);
  return it == names.end() ? kind : it->second;
}

// A GiB figure in `width` characters: 2 decimals while they fit, fewer beyond.
std::string cell(double gib, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%*.*f", width, gib < 1000 ? 2 : gib < 10000 ? 1 : 0, gib);
  if (int(std::string(buf).size()) > width) std::snprintf(buf, sizeof buf, "%*.1e", width, gib);
  return buf;
}

std::string size_label(int64_t T) {
  if (T % (1 << 20) == 0) return std::to_string(T >> 20) + "M";
  if (T % (1 << 10) == 0) return std::to_string(T >> 10) + "K";
  return std::to_string(T);
}

void print_table(const std::vector<Point>& pts, const MemoryOptions& o) {
  // Activation columns: every kind that occurs, in layout order ("alignment" is in the
  // totals only).
  std::vector<std::string> kinds;
  for (const auto& p : pts)
    for (const auto& l : p.plan.lines)
      if (l.group == "activations" && l.name != "alignment" &&
          std::find(kinds.begin(), kinds.end(), l.name) == kinds.end())
        kinds.push_back(l.name);
  const bool measured = std::any_of(pts.begin(), pts.end(), [](const Point& p) { return p.measure; });
  std::printf("%6s %4s %-5s %-12s|%7s%7s%7s |", "T", "B", "attn", "recompute", "params", "grads", "optim");
  for (const auto& k : kinds) std::printf("%*s", int(std::max<size_t>(7, short_kind(k).size() + 1)), short_kind(k).c_str());
  std::printf(" |%7s%7s%7s |%8s %9s", "act", "op scr", "wksp", "total", "act/token");
  if (measured) std::printf(" |%9s %6s %9s %6s  %s", "measured", "diff", "tokens/s", "MFU", "status");
  std::printf("\n");
  for (const auto& p : pts) {
    const MemoryPlan& m = p.plan;
    auto g = [&](double b) { return b / kGiB; };
    std::printf("%6s %4d %-5s %-12s|%s%s%s |", size_label(m.T).c_str(), m.B, m.attention.c_str(),
                m.recompute.c_str(), cell(g(double(m.group_bytes("parameters"))), 7).c_str(),
                cell(g(double(m.group_bytes("gradients"))), 7).c_str(), cell(g(double(m.group_bytes("optimizer"))), 7).c_str());
    for (const auto& k : kinds) {
      size_t b = 0;
      for (const auto& l : m.lines)
        if (l.group == "activations" && l.name == k) b += l.bytes;
      std::printf("%s", cell(g(double(b)), int(std::max<size_t>(7, short_kind(k).size() + 1))).c_str());
    }
    std::printf(" |%s%s%s |%s %5.3f MiB", cell(g(double(m.activation_bytes)), 7).c_str(),
                cell(g(double(m.group_bytes("op scratch"))), 7).c_str(), cell(g(double(m.group_bytes("workspace"))), 7).c_str(),
                cell(g(double(m.total)), 8).c_str(), m.activation_bytes_per_token() / (1 << 20));
    if (p.measure) {
      if (p.m.status == "ok")
        std::printf(" |%9.2f %+5.1f%% %9.0f %5.1f%%  ok", g(p.m.bytes), 100.0 * (double(m.total) - p.m.bytes) / p.m.bytes,
                    p.m.tokens_per_s, 100.0 * p.m.mfu);
      else
        std::printf(" |%9s %6s %9s %6s  %s", "-", "", "-", "", p.m.status.c_str());
    } else if (measured) {
      std::printf(" |%9s %6s %9s %6s  %s", "-", "", "-", "", "plan only");
    }
    std::printf("\n");
  }
  std::printf("GiB per category (T×B tokens per step); act/token = activation arena / (B·T); "
              "op scr = op-set scratch (attention dQ accumulator, reductions)%s\n",
              measured ? "; diff = (plan − measured) / measured; measured = device memory in use "
                         "after the steps less that before the point's context"
                       : "");
  for (const auto& p : pts)
    if (p.measure && p.m.status != "ok" && !p.m.detail.empty())
      std::printf("T=%s %s %s: %s\n", size_label(p.plan.T).c_str(), p.plan.attention.c_str(), p.plan.recompute.c_str(),
                  p.m.detail.c_str());
}

void print_external(const std::vector<External>& ext) {
  if (ext.empty()) return;
  std::printf("\nother measurements (--measured):\n%6s %4s  %-36s|%9s %9s %6s  %s\n", "T", "B", "series", "measured",
              "tokens/s", "MFU", "status");
  for (const auto& e : ext) {
    if (e.m.status == "ok")
      std::printf("%6s %4lld  %-36s|%9.2f %9.0f %5.1f%%  ok\n", size_label(e.T).c_str(), (long long)e.B, e.series.c_str(),
                  e.m.bytes / kGiB, e.m.tokens_per_s, 100 * e.m.mfu);
    else
      std::printf("%6s %4lld  %-36s|%9s %9s %6s  %s\n", size_label(e.T).c_str(), (long long)e.B, e.series.c_str(), "-",
                  "-", "", e.m.status.c_str());
  }
}

nlohmann::json point_json(const Point& p) {
  const MemoryPlan& m = p.plan;
  nlohmann::json lines = nlohmann::json::array();
  for (const auto& l : m.lines) lines.push_back({{"group", l.group}, {"name", l.name}, {"bytes", l.bytes}});
  nlohmann::json j = {{"T", m.T}, {"B", m.B}, {"attention", m.attention}, {"recompute", m.recompute},
                      {"position", m.position}, {"dtype", dtype_name(m.dtype)},
                      {"device", m.device == Device::cuda ? "cuda" : "cpu"}, {"world", m.world}, {"zero", m.zero},
                      {"num_params", m.num_params}, {"plan_bytes", m.total},
                      {"activation_bytes", m.activation_bytes},
                      {"activation_bytes_per_token", m.activation_bytes_per_token()}, {"lines", lines}};
  if (p.measure) {
    j["status"] = p.m.status;
    if (p.m.status == "ok") {
      j["measured_bytes"] = p.m.bytes;
      j["step_ms"] = p.m.step_ms;
      j["tokens_per_s"] = p.m.tokens_per_s;
      j["mfu"] = p.m.mfu;
      j["gpu"] = p.m.gpu;
      j["gpu_total_bytes"] = p.m.gpu_bytes;
    } else {
      j["detail"] = p.m.detail;
    }
  }
  return j;
}

void write_csv(const std::vector<Point>& pts, const std::vector<External>& ext, const std::string& path) {
  std::vector<std::string> cols;  // "group: name" of every plan line that occurs
  for (const auto& p : pts)
    for (const auto& l : p.plan.lines) {
      std::string c = l.group + ": " + l.name;
      if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
    }
  std::ofstream f(path);
  if (!f) fail_input("cannot write --csv file '", path, "'");
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  f << "T,B,attention,recompute,position,dtype,plan_bytes,activation_bytes,activation_bytes_per_token,"
       "status,measured_bytes,step_ms,tokens_per_s,mfu";
  for (const auto& c : cols) f << "," << quoted(c);
  f << "\n";
  for (const auto& p : pts) {
    const MemoryPlan& m = p.plan;
    f << m.T << "," << m.B << "," << m.attention << "," << m.recompute << "," << m.position << ","
      << dtype_name(m.dtype) << "," << m.total << "," << m.activation_bytes << ","
      << m.activation_bytes_per_token() << "," << (p.measure ? p.m.status : "plan") << ",";
    if (p.measure && p.m.status == "ok")
      f << size_t(p.m.bytes) << "," << p.m.step_ms << "," << p.m.tokens_per_s << "," << p.m.mfu;
    else
      f << ",,,";
    for (const auto& c : cols) {
      size_t b = 0;
      for (const auto& l : m.lines)
        if (l.group + ": " + l.name == c) b += l.bytes;
      f << "," << b;
    }
    f << "\n";
  }
  for (const auto& e : ext) {  // measured elsewhere, no plan: the plan columns stay empty
    f << e.T << "," << e.B << ",\"" << e.series << "\",,,,,,," << e.m.status << ",";
    if (e.m.status == "ok") f << size_t(e.m.bytes) << "," << e.m.step_ms << "," << e.m.tokens_per_s << "," << e.m.mfu;
    else f << ",,,";
    for (size_t i = 0; i < cols.size(); ++i) f << ",";
    f << "\n";
  }
}

void write_plot(const std::vector<Point>& pts, const std::vector<External>& ext, const MemoryOptions& o,
                const Config& base, double capacity_gib, const std::string& gpu_name) {
  LogLogPlot plot;
  const bool measured = !ext.empty() || std::any_of(pts.begin(), pts.end(), [](const Point& p) { return p.measure; });
  const std::string name = o.config.substr(o.config.find_last_of('/') + 1);
  plot.title = cat("Training memory against context length: ", name, " (", base.model.n_layer, " layers, C ",
                   base.model.n_embd, ", ", base.model.position, " positions)");
  plot.subtitle = measured ? cat("lines: plan (flashgpt memory); points: measured on ", gpu_name,
                                 "; tokens per step ", o.tokens_per_step ? std::to_string(o.tokens_per_step) : "from the config",
                                 ", B = 1 beyond")
                           : cat("PLAN ONLY (flashgpt memory, no GPU run); tokens per step ",
                                 o.tokens_per_step ? std::to_string(o.tokens_per_step) : "from the config", ", B = 1 beyond");
  plot.x_label = "context length T (tokens)";
  plot.y_label = "device memory (GiB)";
  plot.hline = capacity_gib;
  plot.y_max = 8 * capacity_gib;  // naive attention's T×T matrices go far beyond any GPU
  plot.hline_label = cat(gpu_name, ": ",
                         std::to_string(int(std::round(capacity_gib))), " GiB");
  std::vector<std::string> order;
  std::map<std::string, PlotSeries> by;
  for (const auto& p : pts) {
    const std::string label = p.plan.attention + ", recompute " + p.plan.recompute;
    if (!by.count(label)) {
      order.push_back(label);
      by[label].label = label;
      by[label].dashed = p.plan.attention == "naive";
    }
    PlotSeries& s = by[label];
    const double x = p.plan.T, y = double(p.plan.total) / kGiB;
    s.line.push_back({x, y});
    if (p.measure && p.m.status == "ok") s.measured.push_back({x, p.m.bytes / kGiB});
    if (p.measure && p.m.status != "ok") s.failed.push_back({x, y});
  }
  // Measurements without a plan: a dashed line through the measured points; a run out
  // of memory is crossed on the capacity line.
  for (const auto& e : ext) {
    const std::string label = e.series + " (measured)";
    if (!by.count(label)) {
      order.push_back(label);
      by[label].label = label;
      by[label].dashed = true;
    }
    if (e.m.status == "ok") {
      by[label].measured.push_back({double(e.T), e.m.bytes / kGiB});
      by[label].line.push_back({double(e.T), e.m.bytes / kGiB});
    } else {
      by[label].failed.push_back({double(e.T), capacity_gib});
    }
  }
  for (const auto& l : order) {
    PlotSeries s = by[l];
    std::sort(s.line.begin(), s.line.end(), [](const PlotPoint& a, const PlotPoint& b) { return a.x < b.x; });
    plot.series.push_back(s);
  }
  std::ofstream f(o.plot);
  if (!f) fail_input("cannot write --plot file '", o.plot, "'");
  f << render_svg(plot);
}

void run_memory(const MemoryOptions& o) {
  const Config base = load_config(o.config, o.sets);
  const Device dev = o.device == "cpu" ? Device::cpu : Device::cuda;
  if (o.world < 1) fail_input("--world must be >= 1, got ", o.world);
  if (o.zero != 0 && o.zero != 1) fail_input("--zero must be 0 or 1, got ", o.zero);
  if (o.measure && dev != Device::cuda) fail_input("--measure runs on the GPU: it cannot be used with --device cpu");
  if (o.measure && !cuda_available())
    fail_input("--measure needs a CUDA GPU, and ",
#ifdef FLASHGPT_WITH_CUDA
               "none is visible"
#else
               "this flashgpt was built without CUDA"
#endif
               "; without --measure the plan needs none");
  if (o.measure && o.world != 1) fail_input("--measure runs one process: use --world 1");
  const DType dtype = plan_dtype(base, dev);
  std::vector<int64_t> seqs;
  for (const auto& s : o.seq) seqs.push_back(parse_count(s, "--seq"));
  if (seqs.empty()) seqs.push_back(base.train.seq_len);
  const int64_t measure_max = o.measure_max_seq.empty() ? INT64_MAX : parse_count(o.measure_max_seq, "--measure-max-seq");
  std::vector<std::string> attns = o.attention.empty() ? std::vector<std::string>{base.model.attention} : o.attention;
  std::vector<std::string> recs = o.recompute.empty() ? std::vector<std::string>{base.train.recompute} : o.recompute;
  for (const auto& a : attns)
    if (a != "flash" && a != "naive") fail_input("--attention takes flash and naive, got '", a, "'");
  for (auto& r : recs) r = RecomputePolicy::parse(r).name();

  std::vector<Point> pts;
  for (const auto& a : attns)
    for (const auto& r : recs)
      for (int64_t T : seqs) {
        Point p;
        p.cfg = base;
        p.cfg.train.seq_len = int(T);
        if (o.tokens_per_step > 0) p.cfg.train.batch_size = int(std::max<int64_t>(1, o.tokens_per_step / T));
        p.cfg.model.max_seq_len = std::max<int>(base.model.max_seq_len, int(T));
        p.cfg.model.attention = a;
        p.cfg.train.recompute = r;
        validate_config(p.cfg);
        p.plan = plan_memory(p.cfg, {dev, dtype, o.world, o.zero});
        p.measure = o.measure && T <= measure_max;
        pts.push_back(std::move(p));
      }

  double capacity = o.gpu_gib > 0 ? o.gpu_gib : kH200GiB;
  std::string gpu_name;
  std::vector<External> ext;
  for (const auto& file : o.measured_files) {
    auto more = merge_measured(file, pts);
    ext.insert(ext.end(), more.begin(), more.end());
  }
  // The capacity line of a plot from measurements read back: the GPU they ran on.
  auto take_gpu = [&](const Measured& m) {
    if (m.gpu_bytes > 0 && o.gpu_gib <= 0) capacity = m.gpu_bytes / kGiB;
    if (!m.gpu.empty()) gpu_name = m.gpu;
  };
  for (const auto& p : pts) if (p.measure) take_gpu(p.m);
  for (const auto& e : ext) take_gpu(e.m);
  if (o.measure) {
    // Short contexts first (cheap, and a sweep cut short keeps the most points), each
    // point in a fresh context.
    std::vector<Point*> order;
    for (auto& p : pts) if (p.measure) order.push_back(&p);
    std::stable_sort(order.begin(), order.end(), [](const Point* a, const Point* b) { return a->plan.T < b->plan.T; });
    InitCache init;
    FILE* progress = o.json ? stderr : stdout;  // --json: stdout holds the JSON alone
    const auto t0 = std::chrono::steady_clock::now();
    for (Point* p : order) {
      std::fprintf(progress, "measuring T=%s B=%d %s recompute %s ... ", size_label(p->plan.T).c_str(), p->plan.B,
                   p->plan.attention.c_str(), p->plan.recompute.c_str());
      std::fflush(progress);
      p->m = measure_point(*p, o, init);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (p->m.status == "ok")
        std::fprintf(progress, "%.2f GiB (plan %.2f), %.0f tokens/s, MFU %.1f%% [%.0f s]\n", p->m.bytes / kGiB,
                     double(p->plan.total) / kGiB, p->m.tokens_per_s, 100 * p->m.mfu, elapsed);
      else
        std::fprintf(progress, "%s [%.0f s]\n", p->m.status.c_str(), elapsed);
      std::fflush(progress);
    }
    Backend be = make_backend("cuda", base.train.precision);
    gpu_name = be.gpu_name;
    if (o.gpu_gib <= 0) capacity = double(be.device_memory_total()) / kGiB;
  }

  if (o.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& p : pts) all.push_back(point_json(p));
    std::printf("%s\n", all.dump(1).c_str());
  } else {
    const ModelMemory mm = GPT2::memory(model_config(pts[0].cfg), dev, dtype, pts[0].plan.B, pts[0].plan.T,
                                        model_options(pts[0].cfg));
    std::printf("flashgpt memory: %s, %.1fM parameters at T=%s (%d layers, %d heads, C %d, positions %s), %s on %s, "
                "world %d, ZeRO %d\n",
                o.config.c_str(), double(mm.num_params) / 1e6, size_label(pts[0].plan.T).c_str(), base.model.n_layer,
                base.model.n_head, base.model.n_embd, base.model.position.c_str(), dtype_name(dtype),
                dev == Device::cuda ? "cuda" : "cpu", o.world, o.zero);
    print_table(pts, o);
    print_external(ext);
  }
  if (!o.csv.empty()) write_csv(pts, ext, o.csv);
  if (!o.plot.empty()) write_plot(pts, ext, o, base, capacity, gpu_name.empty() ? "NVIDIA H200" : gpu_name);
}

}  // namespace

void add_memory_command(CLI::App& app) {
  auto o = std::make_shared<MemoryOptions>();
  auto* cmd = app.add_subcommand(
      "memory", "Device memory of a training run per category (plan; --measure: real steps on the GPU)");
  cmd->add_option("-c,--config", o->config, "YAML config (model, batch_size, seq_len, attention, recompute)")
      ->capture_default_str()->check(CLI::ExistingFile);
  cmd->add_option("--set", o->sets, "Override a config key (repeatable)");
  cmd->add_option("--seq", o->seq, "Context lengths, e.g. 1K,4K,1M (default: train.seq_len)")->delimiter(',');
  cmd->add_option("--tokens-per-step", o->tokens_per_step,
                  "Batch size B = max(1, N / T) at each length (default: train.batch_size)")
      ->check(CLI::Range(int64_t(1), INT64_MAX));
  cmd->add_option("--attention", o->attention, "flash,naive (default: model.attention)")->delimiter(',');
  cmd->add_option("--recompute", o->recompute, "Policies, e.g. none,gelu,ln,gelu+ln,attn,block (default: train.recompute)")
      ->delimiter(',');
  cmd->add_option("--device", o->device, "What the plan is for: cuda or cpu")->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--world", o->world, "Data-parallel ranks (optimizer state per rank with --zero 1)")->capture_default_str();
  cmd->add_option("--zero", o->zero, "1: ZeRO-1, master weights and AdamW state sharded over the ranks")->capture_default_str();
  cmd->add_flag("--measure", o->measure, "Run real training steps per point on the GPU and measure");
  cmd->add_option("--warmup", o->warmup, "--measure: untimed steps first")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", o->steps, "--measure: timed steps (the median is reported)")->capture_default_str()
      ->check(CLI::Range(1, INT_MAX));
  cmd->add_option("--measure-max-seq", o->measure_max_seq, "--measure: longer contexts are planned only");
  cmd->add_option("--measured", o->measured_files,
                  "JSON of an earlier --measure --json run (or scripts/memory_torch.py) to merge into the table, CSV "
                  "and plot (repeatable)")->check(CLI::ExistingFile);
  cmd->add_flag("--json", o->json, "Print the points as JSON (bytes)");
  cmd->add_option("--csv", o->csv, "Write the points as CSV (bytes)");
  cmd->add_option("--plot", o->plot, "Write an SVG plot of memory against context length");
  cmd->add_option("--gpu-memory", o->gpu_gib, "The plot's capacity line in GiB (default: the GPU's, or an H200's)");
  cmd->callback([o] { run_memory(*o); });
}

}  // namespace flashgpt
