// Monitoring outputs: TensorBoard event files (report/tensorboard.h) byte for byte against a file
// written by the tensorboard package (tests/fixtures/gen_tensorboard.py), the metrics -> scalar
// mapping, and the HTML/SVG run report (report/html_report.h). A file written here is read back by
// tensorboard's own reader in read_tensorboard.py (ctest: tensorboard_reads_ciuic_events).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>

#include "report/html_report.h"
#include "report/metrics_log.h"
#include "report/tensorboard.h"

namespace ciuic::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(CIUIC_TEST_TMP) / "report" / name;
  {
    std::error_code rm_ec;
    ciuic::remove_tree(d.string(), rm_ec);
  }
  fs::create_directories(d);
  return d;
}

double value_of(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    return std::numeric_limits<double>::quiet_NaN();
  }
  return v.get<double>();
}

TEST(TensorBoard, BytesEqualTheTensorboardPackagesWriter) {
  const fs::path fx = fs::path(CIUIC_FIXTURES_DIR) / "tensorboard";
  const std::string want = read(fx / "reference.tfevents");
  json ref = json::parse(read(fx / "reference.json"));
  std::string got;
  for (const json& e : ref["events"]) {
    if (e.contains("file_version"))
      got += TensorBoardWriter::frame(TensorBoardWriter::file_version_event(e["wall_time"]));
    else
      got += TensorBoardWriter::frame(TensorBoardWriter::scalar_event(
          e["wall_time"], e["step"], e["tag"], static_cast<float>(value_of(e["value"]))));
  }
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the encodings differ from tensorboard's";

  // The same through the writer (file name aside): one add_scalars per wall time.
  const fs::path dir = fresh_dir("tb_bytes");
  {
    TensorBoardWriter w(dir.string(), ref["events"][0]["wall_time"]);
    for (size_t i = 1; i < ref["events"].size(); ++i) {
      const json& e = ref["events"][i];
      w.add_scalar(e["tag"], e["step"], value_of(e["value"]), e["wall_time"]);
    }
    EXPECT_NE(fs::path(w.path()).filename().string().find("events.out.tfevents.1700000000."),
              std::string::npos)
        << w.path();
  }
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(read(files[0]) == want);
}

TEST(TensorBoard, MetricsRecordsBecomeScalarsAndReadBack) {
  int64_t step = -1;
  auto s = tensorboard_scalars(
      json{{"step", 5}, {"loss", 2.5}, {"lr", 1e-4}, {"skipped", false}, {"note", "x"}}, &step);
  EXPECT_EQ(step, 5);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, "train/loss");
  EXPECT_EQ(s[2].first, "train/skipped");
  s = tensorboard_scalars(
      json{{"event", "eval"}, {"step", 10}, {"eval_loss", 1.5}, {"eval_ppl", 4.48}}, &step);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].first, "eval/loss");
  EXPECT_EQ(s[1].first, "eval/ppl");
  s = tensorboard_scalars(
      json{{"event", "exact_match"}, {"when", "after"}, {"step", 20}, {"accuracy", 0.4}}, &step);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, "exact_match/accuracy_after");
  // Issue 33: the held-out evaluation's other figures get the same suffix; "questions" none.
  s = tensorboard_scalars(json{{"event", "exact_match"},
                               {"when", "before"},
                               {"step", 0},
                               {"bleu", 18.5},
                               {"bleu_tokenize", "13a"},
                               {"questions", 200},
                               {"ttft_median_s", 1.2}},
                          &step);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, "exact_match/bleu_before");
  EXPECT_EQ(s[1].first, "exact_match/questions");
  EXPECT_EQ(s[2].first, "exact_match/ttft_median_s_before");
  EXPECT_TRUE(tensorboard_scalars(json{{"event", "end"}, {"steps", 3}}, &step).empty());

  // A metrics log with TensorBoard on, as the trainer runs it; expected.json for the reader.
  const fs::path dir = fresh_dir("tb_reader");
  json expected = json::object();
  {
    MetricsLog log((dir / "metrics.jsonl").string());
    log.enable_tensorboard((dir / "tb").string());
    for (int i = 1; i <= 30; ++i) {
      const double loss = 5.0 / i, lr = 1e-4 * std::min(1.0, i / 10.0), tps = 1000.0 + i;
      log.write({{"step", i}, {"loss", loss}, {"lr", lr}, {"tokens_per_s", tps}});
      expected["train/loss"].push_back({i, loss});
      expected["train/lr"].push_back({i, lr});
      expected["train/tokens_per_s"].push_back({i, tps});
      if (i % 10 == 0) {
        log.write({{"event", "eval"}, {"step", i}, {"eval_loss", 6.0 / i}});
        expected["eval/loss"].push_back({i, 6.0 / i});
      }
    }
    log.write({{"event", "end"}, {"steps", 30}});
  }
  std::ofstream(dir / "tb" / "expected.json") << expected.dump();
  size_t lines = 0;
  std::istringstream in(read(dir / "metrics.jsonl"));
  for (std::string l; std::getline(in, l);) ++lines;
  EXPECT_EQ(lines, 34u);
}

// ---- the run report -----------------------------------------------------------------------
std::string metrics_text(bool gpu) {
  std::string t;
  for (int i = 1; i <= 50; ++i) {
    json r = {{"step", i},
              {"loss", 4.0 * std::exp(-i / 20.0) + 1},
              {"lr", 3e-5 * std::min(1.0, i / 10.0)},
              {"grad_norm", i == 7 ? 5000.0 : 1.0 + 1.0 / i},
              {"tokens_per_s", 20000.0 + 10 * i},
              {"loss_scale", 65536.0}};
    if (gpu) {
      r["mfu"] = 0.41;
      r["mem_gib"] = 30.5;
      r["mem_reserved_gib"] = 33.0;
    }
    t += r.dump() + "\n";
    if (i % 25 == 0)
      t += json{{"event", "eval"}, {"step", i}, {"eval_loss", 2.0 - i / 100.0}}.dump() + "\n";
  }
  t += "not json\n";
  t += json{{"event", "end"},
            {"steps", 50},
            {"tokens_per_s", 21000.5},
            {"elapsed_s", 12.5},
            {"world_size", 2}}
           .dump() +
       "\n";
  return t;
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t p = s.find(part); p != std::string::npos; p = s.find(part, p + part.size())) ++n;
  return n;
}

TEST(RunReport, SelfContainedHtmlWithOneChartPerMetric) {
  const std::string html = render_html_report(metrics_text(true), HtmlReportOptions{"demo <run>"});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<title>demo &lt;run&gt; — ciuic report</title>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no external resource
  for (const char* t : {"Loss", "Learning rate", "Gradient norm", "Throughput", "MFU", "Memory"})
    EXPECT_NE(html.find(std::string("<figcaption>") + t), std::string::npos) << t;
  EXPECT_EQ(html.find("Loss scale"), std::string::npos);  // constant: not drawn
  EXPECT_EQ(count(html, "<svg"), 6u);
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  // One point per record in each line; the eval line has markers.
  std::smatch m;
  const std::regex train_line("data-label=\"train\" points=\"([^\"]*)\"");
  ASSERT_TRUE(std::regex_search(html, m, train_line));
  EXPECT_EQ(count(m[1].str(), ","), 50u);
  EXPECT_EQ(count(html, "<circle"), 2u);
  EXPECT_NE(html.find("Gradient norm (before clipping) — log scale"),
            std::string::npos);  // the 5000 spike
  EXPECT_NE(html.find("1 unreadable lines skipped"), std::string::npos);
  EXPECT_NE(html.find("4.805 → 1.328"), std::string::npos)
      << "loss summary";  // 4e^-0.05+1 -> 4e^-2.5+1

  // Issue 33: the held-out evaluation's BLEU, ROUGE-L and response time, before -> after.
  const std::string em = render_html_report(
      "{\"event\":\"exact_match\",\"when\":\"before\",\"step\":0,\"accuracy\":0.1,\"bleu\":18.5,"
      "\"rouge_l\":0.25}\n"
      "{\"event\":\"exact_match\",\"when\":\"after\",\"step\":9,\"accuracy\":0.5,\"bleu\":23.2,"
      "\"rouge_l\":0.5,"
      "\"ttft_median_s\":0.8}\n");
  EXPECT_NE(em.find("<tr><th>BLEU</th><td>18.5 → 23.2</td></tr>"), std::string::npos) << em;
  EXPECT_NE(em.find("<tr><th>ROUGE-L F</th><td>0.25 → 0.5</td></tr>"), std::string::npos) << em;
  EXPECT_NE(em.find("<tr><th>time to first token, median (s)</th><td>- → 0.8</td></tr>"),
            std::string::npos)
      << em;
  EXPECT_EQ(em.find("answer tokens/s"), std::string::npos) << em;  // in neither record
  // A "during" record (exact_match_every_steps) is no "after": a run stopped before its end.
  const std::string during = render_html_report(
      "{\"event\":\"exact_match\",\"when\":\"before\",\"step\":0,\"accuracy\":0.1,\"bleu\":18.5}\n"
      "{\"event\":\"exact_match\",\"when\":\"during\",\"step\":5,\"accuracy\":0.3,\"bleu\":20.0}"
      "\n");
  EXPECT_NE(during.find("<tr><th>BLEU</th><td>18.5 → -</td></tr>"), std::string::npos) << during;

  const std::string cpu = render_html_report(metrics_text(false));
  EXPECT_EQ(count(cpu, "<svg"), 4u);  // no MFU or memory on CPU runs
  EXPECT_NE(render_html_report("").find("No metrics yet"), std::string::npos);
}

TEST(RunReport, WrittenNextToTheMetricsFile) {
  const fs::path dir = fresh_dir("report_run");
  std::ofstream(dir / "metrics.jsonl") << metrics_text(false);
  const std::string out = write_html_report(dir.string());
  EXPECT_EQ(out, (dir / "report.html").string());
  EXPECT_NE(read(out).find("<h1>report_run</h1>"), std::string::npos);
  EXPECT_EQ(write_html_report((dir / "metrics.jsonl").string()), out);
  try {
    write_html_report((dir / "missing").string());
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no metrics file at"), std::string::npos) << e.what();
  }
}

// The report's size is bounded whatever the number of records (issue 27: 1M records gave 47 MB):
// a series of more than 2000 points is drawn from the lowest and highest value of each of 1000
// step ranges, the report says so, and the extremes (here a spike) are kept.
TEST(RunReport, ManyRecordsAreDrawnFromABoundedNumberOfPoints) {
  std::string text;
  const int n = 200000;
  for (int s = 1; s <= n; ++s)
    text += "{\"step\": " + std::to_string(s) +
            ", \"loss\": " + (s == 123457 ? "50.0" : std::to_string(2.0 + (s % 7) * 0.01)) +
            ", \"lr\": 0.0001}\n";
  const std::string html = render_html_report(text);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(html, m, std::regex("data-label=\"train\" points=\"([^\"]*)\"")));
  const size_t points = count(m[1].str(), ",");
  EXPECT_LE(points, 2000u);
  EXPECT_GE(points, 1000u);
  EXPECT_NE(
      html.find(std::to_string(points) +
                " of 200000 points drawn: the lowest and highest of each of 1000 step ranges"),
      std::string::npos);
  EXPECT_NE(html.find("<th>records</th><td>200000</td>"), std::string::npos);
  // The spike (50 among values of 2.00-2.06) is kept: it is drawn near the top of the plot area
  // (y from 28 to 220), the other points near its bottom.
  double top = 1e9;
  std::istringstream pts(m[1].str());
  for (std::string xy; pts >> xy;) top = std::min(top, std::stod(xy.substr(xy.find(',') + 1)));
  EXPECT_LT(top, 40.0) << "the spike at step 123457 was dropped";
  EXPECT_LT(html.size(), 200u * 1024) << "report of " << html.size() << " bytes";
}

// A record whose known field has the wrong type is bad input named by file and line (before: a raw
// "[json.exception.type_error.302] type must be string, but is number", exit 1).
TEST(RunReport, MistypedRecordIsNamedByFileAndLine) {
  const std::string text = "{\"step\": 1, \"loss\": 3.0}\n{\"event\": 3, \"step\": 2}\n";
  try {
    render_html_report(text, HtmlReportOptions{"run", "runs/x/metrics.jsonl"});
    FAIL() << "a mistyped record was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "runs/x/metrics.jsonl:2: \"event\" is a number, expected a string");
  }
  try {
    render_html_report("{\"event\": \"end\", \"tokens_per_s\": \"fast\"}\n",
                       HtmlReportOptions{"run", "m.jsonl"});
    FAIL() << "a mistyped record was accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "m.jsonl:1: \"tokens_per_s\" is a string, expected a number");
  }
}

}  // namespace
}  // namespace ciuic::report
