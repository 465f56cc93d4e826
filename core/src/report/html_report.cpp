#include "report/html_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include <ciuic/error.h>
#include <ciuic/json.h>
#include <ciuic/log.h>

namespace ciuic::report {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using Series = std::map<int64_t, double>;  // step -> value (a later record of a step replaces it)

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v, int prec = 4) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char b[48];
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3))
    std::snprintf(b, sizeof b, "%.*e", std::max(prec - 2, 1), v);
  else
    std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

std::string coord(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// "Nice" axis ticks covering [lo, hi]: 1, 2 or 5 times a power of ten, about `n` of them.
std::vector<double> ticks(double lo, double hi, int n = 5) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

struct Line {
  std::string label, color;
  const Series* data;
  bool markers = false;
};

// The points of `data` a chart draws: all of them up to 2 * kColumns; beyond, for each of kColumns
// equal step ranges of [x0, x1], its lowest and highest value in step order (what a line of that
// width shows anyway), so that a report stays small however long the run (1M records: 47 MB
// before).
constexpr size_t kColumns = 1000;
std::vector<std::pair<int64_t, double>> drawn_points(const Series& data, double x0, double x1,
                                                     const std::function<bool(double)>& drawable) {
  std::vector<std::pair<int64_t, double>> all;
  for (const auto& [s, v] : data)
    if (drawable(v)) all.emplace_back(s, v);
  if (all.size() <= 2 * kColumns) return all;
  std::vector<std::pair<int64_t, double>> out;
  size_t i = 0;
  while (i < all.size()) {
    const auto column = [&](int64_t s) {
      return std::min<size_t>(kColumns - 1,
                              static_cast<size_t>((double(s) - x0) / (x1 - x0) * kColumns));
    };
    const size_t c = column(all[i].first);
    size_t lo = i, hi = i, j = i;
    for (; j < all.size() && column(all[j].first) == c; ++j) {
      if (all[j].second < all[lo].second) lo = j;
      if (all[j].second > all[hi].second) hi = j;
    }
    out.push_back(all[std::min(lo, hi)]);
    if (lo != hi) out.push_back(all[std::max(lo, hi)]);
    i = j;
  }
  return out;
}

// One chart: lines over steps. Log scale on y when every value is positive and they span more than
// three decades (gradient norms with spikes, fp16 loss scales).
std::string chart(const std::string& title, const std::string& unit, const std::vector<Line>& lines,
                  double scale = 1) {
  const double W = 720, H = 260, L = 72, R = 16, T = 28, B = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  size_t points = 0;
  for (const auto& l : lines)
    for (const auto& [s, v] : *l.data) {
      if (!std::isfinite(v)) continue;
      x0 = std::min(x0, double(s));
      x1 = std::max(x1, double(s));
      y0 = std::min(y0, v * scale);
      y1 = std::max(y1, v * scale);
      ++points;
    }
  if (points == 0) return "";
  const bool logy = y0 > 0 && y1 / y0 > 1e3;
  auto fy = [&](double v) { return logy ? std::log10(v) : v; };
  double ly0 = fy(y0), ly1 = fy(y1);
  if (ly1 - ly0 < 1e-12) {
    const double pad = std::max(std::fabs(ly0) * 0.05, 1e-9);
    ly0 -= pad;
    ly1 += pad;
  } else if (!logy) {
    const double pad = (ly1 - ly0) * 0.05;
    ly0 = (y0 >= 0 && ly0 - pad < 0) ? 0 : ly0 - pad;
    ly1 += pad;
  }
  if (x1 - x0 < 1) {
    x0 -= 1;
    x1 += 1;
  }
  auto px = [&](double s) { return L + (s - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double v) { return T + (1 - (fy(v) - ly0) / (ly1 - ly0)) * (H - T - B); };
  std::ostringstream o;
  o << "<figure><figcaption>" << esc(title) << (unit.empty() ? "" : " (" + esc(unit) + ")")
    << (logy ? " — log scale" : "") << "</figcaption>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"" << esc(title)
    << "\">\n";
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << (W - L - R) << "\" height=\""
    << (H - T - B) << "\" fill=\"#fff\" stroke=\"#bbb\"/>\n";
  // y ticks
  std::vector<double> yt;
  if (logy) {
    for (double e = std::ceil(ly0); e <= std::floor(ly1); e += 1) yt.push_back(std::pow(10.0, e));
  } else {
    yt = ticks(ly0, ly1);
  }
  for (double v : yt) {
    const double y = py(v);
    o << "<line x1=\"" << L << "\" x2=\"" << (W - R) << "\" y1=\"" << coord(y) << "\" y2=\""
      << coord(y) << "\" stroke=\"#eee\"/><text x=\"" << (L - 6) << "\" y=\"" << coord(y + 4)
      << "\" text-anchor=\"end\" class=\"tick\">" << num(v, 3) << "</text>\n";
  }
  for (double s : ticks(x0, x1, 6)) {
    if (s < x0 || s > x1) continue;
    const double x = px(s);
    o << "<line x1=\"" << coord(x) << "\" x2=\"" << coord(x) << "\" y1=\"" << T << "\" y2=\""
      << (H - B) << "\" stroke=\"#eee\"/><text x=\"" << coord(x) << "\" y=\"" << (H - B + 16)
      << "\" text-anchor=\"middle\" class=\"tick\">" << num(s, 6) << "</text>\n";
  }
  o << "<text x=\"" << (L + (W - L - R) / 2) << "\" y=\"" << (H - 6)
    << "\" text-anchor=\"middle\" class=\"axis\">step</text>\n";
  double legend_x = L + 8;
  size_t total = 0, shown = 0;
  for (const auto& l : lines) {
    std::string pts;
    size_t n = 0;
    const auto points = drawn_points(
        *l.data, x0, x1, [&](double v) { return std::isfinite(v) && !(logy && v * scale <= 0); });
    for (const auto& [s, v] : *l.data) total += std::isfinite(v) && !(logy && v * scale <= 0);
    shown += points.size();
    for (const auto& [s, v] : points)
      pts += (n++ ? " " : "") + coord(px(double(s))) + "," + coord(py(v * scale));
    if (n == 0) continue;
    o << "<polyline class=\"series\" data-label=\"" << esc(l.label) << "\" points=\"" << pts
      << "\" fill=\"none\" stroke=\"" << l.color << "\" stroke-width=\"1.6\"/>\n";
    if (l.markers || n == 1)
      for (const auto& [s, v] : points)
        o << "<circle cx=\"" << coord(px(double(s))) << "\" cy=\"" << coord(py(v * scale))
          << "\" r=\"3\" fill=\"" << l.color << "\"><title>step " << s << ": " << num(v * scale)
          << "</title></circle>\n";
    o << "<rect x=\"" << coord(legend_x) << "\" y=\"10\" width=\"12\" height=\"4\" fill=\""
      << l.color << "\"/><text x=\"" << coord(legend_x + 16) << "\" y=\"16\" class=\"legend\">"
      << esc(l.label) << "</text>\n";
    legend_x += 24 + 7.0 * static_cast<double>(l.label.size());
  }
  o << "</svg>";
  if (shown < total)
    o << "<p class=\"note\">" << shown << " of " << total
      << " points drawn: the lowest and highest of each of " << kColumns << " step ranges</p>";
  o << "</figure>\n";
  return o.str();
}

// The per-rank section: one line per rank up to kRankLines ranks; beyond, the lowest, median and
// highest rank at each step (a chart of 64 lines shows nothing).
constexpr size_t kRankLines = 8;
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

std::string rank_charts(const std::map<std::string, std::map<int64_t, Series>>& ranks,
                        const std::vector<json>& stragglers) {
  if (ranks.empty()) return "";
  size_t world = 0;
  for (const auto& [key, by_rank] : ranks) world = std::max(world, by_rank.size());
  std::ostringstream o;
  o << "<h2>Ranks</h2>\n<p>" << world
    << " rank(s), from their own figures at each log step (\"rank\" records).</p>\n";
  if (!stragglers.empty()) {
    o << "<table>\n";
    for (const json& g : stragglers) {
      std::string what;
      if (g.value("event", "") == "straggler_recovered") {
        what = "no longer slower than the others";
      } else {
        what = (g.contains("slower") && g["slower"].is_number()
                    ? num(100 * g["slower"].get<double>(), 3) + "% slower than the median"
                    : std::string("slower"));
        if (g.contains("steps") && g["steps"].is_number())
          what += " for " + g["steps"].dump() + " steps";
        if (g.contains("data_wait_s") && g["data_wait_s"].is_number())
          what += "; data wait " + num(g["data_wait_s"].get<double>(), 3) + " s/step";
      }
      o << "<tr><th>straggler</th><td>step " << g["step"].dump() << ": rank "
        << (g.contains("rank") ? g["rank"].dump() : std::string("?")) << " " << esc(what)
        << "</td></tr>\n";
    }
    o << "</table>\n";
  }
  std::deque<Series> spread;  // storage of the min/median/max lines (push_back keeps addresses)
  auto draw = [&](const char* key, const std::string& title, const std::string& unit,
                  double scale) {
    const auto it = ranks.find(key);
    if (it == ranks.end()) return;
    std::vector<Line> lines;
    if (it->second.size() <= kRankLines) {
      size_t i = 0;
      for (const auto& [rank, series] : it->second)
        lines.push_back({"rank " + std::to_string(rank), kPalette[i++ % 8], &series});
    } else {
      std::map<int64_t, std::vector<double>> at;
      for (const auto& [rank, series] : it->second)
        for (const auto& [step, v] : series) at[step].push_back(v);
      Series lo, mid, hi;
      for (auto& [step, v] : at) {
        std::sort(v.begin(), v.end());
        lo[step] = v.front();
        mid[step] = v[v.size() / 2];
        hi[step] = v.back();
      }
      spread.push_back(std::move(lo));
      lines.push_back({"lowest rank", "#2ca02c", &spread.back()});
      spread.push_back(std::move(mid));
      lines.push_back({"median", "#1f77b4", &spread.back()});
      spread.push_back(std::move(hi));
      lines.push_back({"highest rank", "#d62728", &spread.back()});
    }
    o << chart(title, unit, lines, scale);
  };
  draw("work_s", "Data wait + forward/backward per rank", "s per step", 1);
  draw("step_s", "Step time per rank", "s", 1);
  draw("data_wait_s", "Data wait per rank", "s per step", 1);
  draw("device_busy", "Device busy per rank", "% of the interval", 100);
  draw("compute_busy", "Compute busy per rank (loop timers)",
       "% of the step outside data and collectives", 100);
  draw("comm_wait_s", "Waiting in collectives per rank", "s of the step", 1);
  draw("mem_gib", "Device memory per rank", "GiB, peak allocated", 1);
  draw("mem_reserved_gib", "Device memory reserved per rank", "GiB, peak", 1);
  draw("link_bytes_per_s", "Link traffic per rank", "GB/s handed to collectives", 1e-9);
  draw("link_sent_bytes_per_s", "Link sent per rank", "GB/s, ring algorithm's bytes", 1e-9);
  draw("link_received_bytes_per_s", "Link received per rank", "GB/s, ring algorithm's bytes", 1e-9);
  draw("link_busy", "Link busy per rank", "% of the interval", 100);
  draw("optim_step_s", "Optimizer host time per rank", "s per step", 1);
  draw("host_rss_gib", "Host memory per rank", "GiB resident", 1);
  return o.str();
}

std::string type_of(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

}  // namespace

std::string render_html_report(const std::string& metrics_jsonl, const HtmlReportOptions& options) {
  std::map<std::string, Series> train;  // key -> series
  Series eval_loss;
  json end, em_before, em_after;
  std::map<std::string, std::map<int64_t, Series>> ranks;  // key -> rank -> series ("rank" records)
  std::vector<json> stragglers;
  size_t records = 0, bad = 0, lineno = 0;
  std::istringstream in(metrics_jsonl);
  std::string line;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A line nested too deep is a bad line like one that is not JSON (counted, not drawn).
    json r = json_depth_problem(line).empty() ? json::parse(line, nullptr, false) : json();
    if (!r.is_object()) {
      // The last line of a file still being written (--plot during a run) is not bad, only not
      // complete yet.
      if (!(in.eof() && !metrics_jsonl.empty() && metrics_jsonl.back() != '\n')) ++bad;
      continue;
    }
    ++records;
    // A record whose fields have the wrong type is bad input, named where it is.
    auto expect = [&](const char* key, bool is_ok, const char* want) {
      if (is_ok) return;
      throw UsageError((options.source.empty() ? std::string("metrics") : options.source) + ":" +
                       std::to_string(lineno) + ": \"" + key + "\" is " + type_of(r[key]) +
                       ", expected " + want);
    };
    auto field = [&](const char* key, bool (json::*is)() const noexcept, const char* want) {
      if (r.contains(key)) expect(key, (r[key].*is)(), want);
    };
    field("event", &json::is_string, "a string");
    field("when", &json::is_string, "a string (\"before\" or \"after\")");
    for (const char* k : {"eval_loss", "accuracy", "tokens_per_s", "elapsed_s", "peak_mem_gib"})
      field(k, &json::is_number, "a number");
    const std::string event = r.value("event", "");
    const bool has_step = r.contains("step") && r["step"].is_number_integer();
    if (event.empty() && has_step) {
      const int64_t step = r["step"].get<int64_t>();
      for (auto it = r.begin(); it != r.end(); ++it)
        if (it->is_number() && it.key() != "step") train[it.key()][step] = it->get<double>();
    } else if (event == "eval" && has_step && r.contains("eval_loss") &&
               r["eval_loss"].is_number()) {
      eval_loss[r["step"].get<int64_t>()] = r["eval_loss"].get<double>();
    } else if (event == "end") {
      end = r;
    } else if (event == "exact_match") {
      if (r.value("when", "") != "during")
        (r.value("when", "") == "before" ? em_before : em_after) = r;
    } else if (event == "rank" && has_step && r.contains("rank") && r["rank"].is_number_integer()) {
      const int64_t step = r["step"].get<int64_t>(), rank = r["rank"].get<int64_t>();
      for (auto it = r.begin(); it != r.end(); ++it)
        if (it->is_number() && it.key() != "step" && it.key() != "rank")
          ranks[it.key()][rank][step] = it->get<double>();
    } else if ((event == "straggler" || event == "straggler_recovered") && has_step) {
      stragglers.push_back(r);
    }
  }
  auto series = [&](const char* k) -> const Series* {
    auto it = train.find(k);
    return it == train.end() ? nullptr : &it->second;
  };
  static const Series kEmpty;
  auto or_empty = [&](const Series* s) { return s ? s : &kEmpty; };

  std::ostringstream o;
  const std::string title = options.title.empty() ? "ciuic run" : options.title;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << esc(title)
    << " — ciuic report</title>\n<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}"
       "h1{font-size:20px}figure{margin:18px 0}figcaption{font-weight:600;margin-bottom:4px}"
       "table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid "
       "#eee;text-align:left}"
       "h2{font-size:17px;margin-top:28px}svg text{font:11px system-ui,sans-serif;fill:#444}svg "
       ".legend{fill:#222}</style></head><body>\n";
  o << "<h1>" << esc(title) << "</h1>\n<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    o << "<tr><th>" << esc(k) << "</th><td>" << esc(v) << "</td></tr>\n";
  };
  const Series* loss = series("loss");
  row("records", std::to_string(records) +
                     (bad ? " (" + std::to_string(bad) + " unreadable lines skipped)" : ""));
  if (loss && !loss->empty()) {
    row("steps logged",
        std::to_string(loss->begin()->first) + " – " + std::to_string(loss->rbegin()->first));
    row("loss", num(loss->begin()->second) + " → " + num(loss->rbegin()->second));
  }
  if (!eval_loss.empty())
    row("eval loss", num(eval_loss.begin()->second) + " → " + num(eval_loss.rbegin()->second));
  if (!em_before.empty() || !em_after.empty()) {
    auto acc = [](const json& r) {
      return r.contains("accuracy") ? num(100 * r["accuracy"].get<double>(), 3) + "%"
                                    : std::string("-");
    };
    row("exact match", acc(em_before) + " → " + acc(em_after));
    // The other figures of the same records (train/evaluate.cpp), where the run computed them.
    for (const auto& [k, label] : std::initializer_list<std::pair<const char*, const char*>>{
             {"bleu", "BLEU"},
             {"rouge_l", "ROUGE-L F"},
             {"ttft_median_s", "time to first token, median (s)"},
             {"answer_tokens_per_s_median", "answer tokens/s, median"}}) {
      auto v = [&](const json& r) {
        return r.contains(k) && r[k].is_number() ? num(r[k].get<double>(), 4) : std::string("-");
      };
      if (em_before.contains(k) || em_after.contains(k))
        row(label, v(em_before) + " → " + v(em_after));
    }
  }
  if (!end.empty()) {
    if (end.contains("tokens_per_s"))
      row("tokens/s (whole run)", num(end["tokens_per_s"].get<double>()));
    if (end.contains("elapsed_s")) row("elapsed", num(end["elapsed_s"].get<double>()) + " s");
    if (end.contains("world_size")) row("world size", end["world_size"].dump());
    if (end.contains("skipped")) row("skipped steps", end["skipped"].dump());
    if (end.contains("peak_mem_gib"))
      row("peak memory", num(end["peak_mem_gib"].get<double>()) + " GiB");
  } else {
    row("end", "no end record (the run is still going, or stopped early)");
  }
  o << "</table>\n";
  if (records == 0) o << "<p>No metrics yet.</p>\n";
  o << chart("Loss", "mean token loss",
             {{"train", "#1f77b4", or_empty(loss)}, {"eval", "#d62728", &eval_loss, true}});
  o << chart("Learning rate", "", {{"lr", "#2ca02c", or_empty(series("lr"))}});
  o << chart("Gradient norm", "before clipping",
             {{"grad_norm", "#9467bd", or_empty(series("grad_norm"))}});
  o << chart("Throughput", "tokens/s, all ranks",
             {{"tokens/s", "#ff7f0e", or_empty(series("tokens_per_s"))}});
  o << chart("MFU", "%", {{"mfu", "#8c564b", or_empty(series("mfu"))}}, 100.0);
  o << chart("Memory", "GiB per device",
             {{"peak allocated", "#17becf", or_empty(series("mem_gib"))},
              {"peak reserved", "#7f7f7f", or_empty(series("mem_reserved_gib"))}});
  if (const Series* ls = series("loss_scale");
      ls && ls->size() > 1 && ls->begin()->second != ls->rbegin()->second)
    o << chart("Loss scale", "dynamic loss scaling", {{"loss_scale", "#bcbd22", ls}});
  o << rank_charts(ranks, stragglers);
  o << "</body></html>\n";
  return o.str();
}

std::string write_html_report(const std::string& run_dir_or_metrics_file) {
  std::error_code ec;
  fs::path metrics = run_dir_or_metrics_file;
  if (fs::is_directory(metrics, ec)) metrics /= "metrics.jsonl";
  if (!fs::is_regular_file(metrics, ec))
    throw UsageError("no metrics file at " + metrics.string() +
                     " (give a run folder holding metrics.jsonl, or the file)");
  std::ifstream f(metrics, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  HtmlReportOptions opt;
  opt.source = metrics.string();
  fs::path dir = metrics.parent_path();
  opt.title = fs::absolute(dir).lexically_normal().filename().string();
  if (opt.title.empty()) opt.title = "run";
  // A temporary file of this process's own: --plot during a run may write while the run does.
  const fs::path out = dir / "report.html",
                 tmp = dir / (".report.html." + std::to_string(::getpid()) + ".tmp");
  {
    std::ofstream w(tmp, std::ios::binary | std::ios::trunc);
    w << render_html_report(ss.str(), opt);
    if (!w) throw Error("cannot write " + tmp.string());
  }
  fs::rename(tmp, out, ec);
  if (ec)
    throw Error("cannot rename " + tmp.string() + " to " + out.string() + ": " + ec.message());
  return out.string();
}

void write_html_report_or_warn(const std::string& metrics_file) noexcept {
  if (metrics_file.empty()) return;
  try {
    log_info("run report: " + write_html_report(metrics_file));
  } catch (const std::exception& e) {
    log_warn(std::string("no run report: ") + e.what());
  }
}

}  // namespace ciuic::report
