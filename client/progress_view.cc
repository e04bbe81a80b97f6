// Progress bar and shard map rendering for the CLI.
#include "client/progress_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "zeroshard/v1/shard_plan.pb.h"

namespace zeroshard::client {

ProgressView::ProgressView(std::string job_id, int64_t total_steps, bool terminal,
                           std::ostream* out)
    : job_id_(std::move(job_id)), total_steps_(total_steps), terminal_(terminal), out_(out) {}

std::string ProgressView::ProgressLine(const v1::StepMetrics& metrics, int64_t total_steps,
                                       int bar_width) {
  // The whole iteration (forward, backward and step) where the worker reports it; older workers
  // report the engine's step alone.
  const bool whole_iteration = metrics.iteration_ms() > 0;
  const double per_step_ms = whole_iteration ? metrics.iteration_ms() : metrics.step_ms();
  const char* const unit = whole_iteration ? "iter" : "step";
  std::string line;
  if (total_steps <= 0) {
    // No end to measure against: no bar and no ETA.
    line = absl::StrFormat("step %d  loss %.6g  %.2f ms/%s", metrics.step(), metrics.loss(),
                           per_step_ms, unit);
  } else {
    const int64_t step = std::clamp<int64_t>(metrics.step(), 0, total_steps);
    const int filled = static_cast<int>(bar_width * step / total_steps);
    const int64_t eta_s =
        static_cast<int64_t>(std::llround((total_steps - step) * per_step_ms / 1000.0));
    line = absl::StrFormat("[%s%s] %*d/%d  loss %.6g  %.2f ms/%s  ETA %d:%02d:%02d",
                           std::string(filled, '#'), std::string(bar_width - filled, '-'),
                           static_cast<int>(absl::StrCat(total_steps).size()), step, total_steps,
                           metrics.loss(), per_step_ms, unit, eta_s / 3600, eta_s / 60 % 60,
                           eta_s % 60);
  }
  if (metrics.vmhwm_bytes() > 0) {
    absl::StrAppendFormat(&line, "  peak RSS %.1f MiB", metrics.vmhwm_bytes() / 1048576.0);
  }
  return line;
}

std::string StepOfTotal(int64_t step, int64_t total_steps) {
  return total_steps > 0 ? absl::StrCat(step, "/", total_steps) : absl::StrCat(step);
}

void ProgressView::OnEvent(const v1::JobEvent& event) {
  switch (event.type()) {
    case v1::PROGRESS: {
      const std::string line = ProgressLine(event.progress(), total_steps_, 30);
      if (terminal_) {
        *out_ << "\r" << job_id_ << " " << line << std::flush;
        bar_open_ = true;
      } else {
        *out_ << job_id_ << " " << line << "\n";
      }
      return;
    }
    case v1::STATE_CHANGED:
      state_ = event.state();
      Close();
      *out_ << job_id_ << " " << v1::JobState_Name(event.state());
      if (!event.message().empty()) *out_ << ": " << event.message();
      *out_ << "\n" << std::flush;
      return;
    case v1::CHECKPOINT_COMMITTED:
      Close();
      *out_ << job_id_ << " checkpoint at step " << event.checkpoint().step() << "\n";
      return;
    case v1::NOTICE:
      Close();
      *out_ << job_id_ << " notice: " << event.message() << "\n";
      return;
    default:
      return;
  }
}

void ProgressView::Close() {
  if (bar_open_) *out_ << "\n" << std::flush;
  bar_open_ = false;
}

void PrintShardMap(const std::vector<v1::ShardPlan>& ranks, std::ostream* out) {
  if (ranks.empty()) return;
  const v1::ShardPlan& global = ranks.front();
  *out << absl::StrFormat(
      "job %s generation %d: world_size %d, %d tensors (%d elements), %d buckets of %d "
      "elements (the last one shorter; a tensor may span buckets), padded to %d elements, "
      "plan version %d, layout hash %016x\n",
      global.job_id(), global.generation(), global.world_size(), global.tensor_count(),
      global.model_elems(), global.bucket_count(), global.bucket_elems(), global.total_elems(),
      global.plan_version(), global.layout_hash());
  *out << "\nbuckets:\n";
  *out << absl::StrFormat("  %-6s %-24s %-12s %-12s %-12s %s\n", "BUCKET", "FLAT RANGE", "PADDED",
                          "PIECE", "TENSOR ELEMS", "TENSORS ('...': continues in another bucket)");
  for (const v1::PlanBucket& bucket : global.buckets()) {
    std::string names;
    for (int t = bucket.first_tensor(); t < bucket.first_tensor() + bucket.tensor_count(); ++t) {
      if (t < 0 || t >= global.tensors_size()) break;
      const v1::PlanTensor& tensor = global.tensors(t);
      const bool before = tensor.first_bucket() < bucket.index();
      const bool after = tensor.first_bucket() + tensor.bucket_count() - 1 > bucket.index();
      absl::StrAppend(&names, names.empty() ? "" : ", ", before ? "..." : "", tensor.name(),
                      after ? "..." : "");
    }
    *out << absl::StrFormat("  %-6d %-24s %-12d %-12d %-12d %s\n", bucket.index(),
                            absl::StrCat("[", bucket.flat_begin(), ", ",
                                         bucket.flat_begin() + bucket.padded_elems(), ")"),
                            bucket.padded_elems(), bucket.piece_elems(), bucket.tensor_elems(),
                            names);
  }
  *out << "\npieces per rank:\n";
  *out << absl::StrFormat("  %-5s %-7s %-14s %-14s %-14s %s\n", "RANK", "PIECES", "OWNED ELEMS",
                          "MODEL ELEMS", "FRAGMENTS", "fp32 BYTES");
  for (const v1::ShardPlan& rank : ranks) {
    int64_t owned = 0, model = 0, fragments = 0;
    for (const v1::PlanPiece& piece : rank.pieces()) {
      owned += piece.flat_end() - piece.flat_begin();
      fragments += piece.fragments_size();
      for (const v1::PlanFragment& fragment : piece.fragments()) {
        model += fragment.end() - fragment.begin();
      }
    }
    *out << absl::StrFormat("  %-5d %-7d %-14d %-14d %-14d %d\n", rank.rank(), rank.pieces_size(),
                            owned, model, fragments, owned * 4);
  }
}

}  // namespace zeroshard::client
