// Internal: the run report — one self-contained HTML file with inline SVG charts (no scripts, no
// external files) drawn from metrics.jsonl: train and eval loss, learning rate, gradient norm,
// tokens/s, MFU, memory and the fp16 loss scale over steps, plus a summary of the run's end and
// exact-match records. Written at the end of every run (rank 0) and by `ciuic-run --plot RUN_DIR`.
//
// Records of a resumed run (appended to the same file) replace earlier records of the same step.
// Lines that are not JSON objects are skipped and counted in the report. Charts without data
// (MFU and memory on CPU runs) are left out.
#pragma once

#include <ciuic/export.h>
#include <string>

#include <nlohmann/json.hpp>

namespace ciuic::report {

struct HtmlReportOptions {
  std::string title;   // default: the run folder's name
  std::string source;  // the metrics file's name, for errors (default "metrics")
};

// The report as HTML from the text of a metrics.jsonl. A chart draws at most about 2000 points per
// series (beyond, the lowest and highest value of each of 1000 step ranges, and says so), so the
// report's size is bounded whatever the number of records. Throws UsageError naming
// "<source>:<line>" and the field when a record's known field has the wrong type (e.g. "event" is
// a number); lines that are not JSON objects are skipped and counted.
CIUIC_API std::string render_html_report(const std::string& metrics_jsonl,
                                         const HtmlReportOptions& options = {});

// Reads `run_dir`/metrics.jsonl (or `run_dir` itself when it is a file) and writes report.html next
// to it (atomically: a temporary file renamed). Returns the path written. Throws UsageError when
// there is no metrics file or a record is mistyped (render_html_report), Error when it cannot
// write.
CIUIC_API std::string write_html_report(const std::string& run_dir_or_metrics_file);

// For the end of a run: write_html_report(metrics_file) and log where it went; a failure is logged
// as a warning and never fails the run. Does nothing for an empty path (ranks other than 0).
CIUIC_API void write_html_report_or_warn(const std::string& metrics_file) noexcept;

}  // namespace ciuic::report
