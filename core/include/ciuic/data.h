// ciuic/data.h — the data source slot ([data] plugin = cached_ssd | synthetic | ...).
//
// A DataSource yields micro-batches for one rank. Given the same (seed, world, rank, settings)
// it yields the same sequence of batches on every run; ranks see disjoint samples; cursor() /
// seek() make a resumed run continue with exactly the batches an uninterrupted run would have seen.
//
// Batches are CPU tensors (pinned when DataOpenArgs::pin_memory); the trainer copies them to the
// device. Shapes [micro_batch_size, seq_len], int64:
//   input_ids     token ids
//   labels        the token each position must predict (already shifted: labels[t] is the id
//                 that follows input_ids[t]), -100 where no loss is taken (prompt tokens,
//                 padding, the last token of a document when packing)
//   position_ids  position within the document: restarts at 0 at every document start, so the
//                 model applies rotary positions per document and masks attention across
//                 document boundaries (a new document starts exactly where position_ids == 0)
//
// Rules every source follows (the trainer relies on them; the data kit, libciuic_data_kit.a with
// ciuic/kit/packed_stream.h, implements all of them for a source that can list its documents):
//   - padding: pad tokens carry labels -100 and count as a document of their own (position_ids
//     restart at 0), so they never attend to or teach anything; num_label_tokens excludes them;
//   - a document longer than a row is either truncated (counted and warned about) or cut at the
//     row end and continued at the start of a later row; the last token of such a piece keeps its
//     label (the document's next token), the last token of a whole document has -100;
//   - BOS/EOS are the source's business (e.g. cached_ssd's add_bos/add_eos, using the tokenizer's
//     ids); the trainer adds nothing;
//   - training rows are dealt by global row number: rank k of W reads rows g + k, g + k + W, ...,
//     which is what makes the cursor below a global position (ciuic/kit/sampler.h);
//   - eval: every rank yields the same number of eval batches (a rank whose share ran out yields
//     all-padding rows), because the eval loss is summed over ranks with collectives.
//
// Threading: next()/eval calls from one thread; implementations may prefetch on their own threads.
// Failure: ciuic::Error naming the file (and line, for malformed input) at fault; an empty
// dataset is an error at open().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include <ciuic/plugin.h>

namespace ciuic {

class Tokenizer;
class ChatTemplate;

struct Batch {
  at::Tensor input_ids;
  at::Tensor labels;
  at::Tensor position_ids;
  int64_t num_label_tokens = 0;  // count of labels != -100
  int64_t num_documents = 0;     // documents (or parts of them) in the batch
};

// The rank, world size and seed are the RunContext's (PluginArgs::context: rank, world_size,
// seed), which the source keeps from its factory.
struct DataOpenArgs {
  int64_t seq_len = 0;
  int64_t micro_batch_size = 0;
  bool pin_memory = false;
  // The model's tokenizer and the recipe's chat template; null when the recipe has none (sources
  // that need them must then fail at open() with a message saying so).
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
};

class CIUIC_API DataSource : public PluginObject {
 public:
  // Called once, on the main thread, before any other call but the destructor: reads (or builds)
  // the data for this rank with these settings and may start prefetch threads. Failure:
  // ciuic::UsageError for what the recipe got wrong (a missing file, a tokenizer the source needs
  // and has not got, a row shape it cannot make), ciuic::Error for what the data got wrong (the
  // file and line at fault); an empty training split is an error here, not at the first next().
  virtual void open(const DataOpenArgs& args) = 0;
  // The next training micro-batch (Batch's shapes and rules above). Training data is endless:
  // epochs follow one another, each reshuffled from the seed and the epoch number; next() never
  // returns an empty batch. Main thread (a prefetch thread may have made it). Failure: ciuic::Error
  // naming the file and line of a malformed record that the source does not skip, or the I/O error;
  // the trainer stops the run (no partial batch is used).
  virtual Batch next() = 0;
  // Opaque position (JSON text) of the next batch next() will return; seek() restores it.
  // Contract: the cursor is a global position — after the same number of next() calls every rank
  // returns the same string, naming the next global batch (e.g. {"epoch": e, "row": r}, rank k
  // reading r + k). A checkpoint stores every rank's cursor. Resumed on the same world size, each
  // rank seeks to its own; on another world size, every rank seeks to rank 0's, and seek() must
  // then continue this rank's share of that global batch for the new world size and micro-batch
  // (DataOpenArgs). A checkpoint whose ranks' cursors differ cannot resume on another world size
  // and is refused, naming both cursors. cursor(): main thread, cheap, after open().
  // seek(): main thread, after open() and before the first next() (a resume); a cursor this source
  // cannot read (another source's, a damaged checkpoint) is a ciuic::Error quoting it — it never
  // silently restarts at the beginning.
  virtual std::string cursor() const = 0;
  virtual void seek(const std::string& cursor) = 0;
  // The epoch the next training batch belongs to (0 first), reported by the core as the
  // data_epoch metric at logged steps. Main thread; cheap. Default: -1 (not known, not reported).
  virtual int64_t epoch() const;

  // Held-out split. Each begin_eval() restarts it; next_eval() yields its batches in a fixed
  // order (this rank's part) and nullopt at its end. has_eval() false: no held-out split. Main
  // thread, between training steps; the training position (cursor()) is not moved by them. Every
  // rank yields the same number of eval batches (the rule above).
  virtual bool has_eval() const { return false; }
  virtual void begin_eval() {}
  virtual std::optional<Batch> next_eval() { return std::nullopt; }
};

}  // namespace ciuic
