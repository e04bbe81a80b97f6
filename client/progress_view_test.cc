// Tests for the CLI's progress bar and event rendering.
#include "client/progress_view.h"

#include <sstream>

#include "gtest/gtest.h"

namespace zeroshard::client {
namespace {

v1::JobEvent Progress(int64_t step, double loss, double step_ms) {
  v1::JobEvent event;
  event.set_type(v1::PROGRESS);
  event.mutable_progress()->set_step(step);
  event.mutable_progress()->set_loss(loss);
  event.mutable_progress()->set_step_ms(step_ms);
  return event;
}

v1::JobEvent State(v1::JobState state, const std::string& message) {
  v1::JobEvent event;
  event.set_type(v1::STATE_CHANGED);
  event.set_state(state);
  event.set_message(message);
  return event;
}

TEST(ProgressViewTest, ProgressLineShowsBarStepLossAndEta) {
  v1::StepMetrics metrics;
  metrics.set_step(40);
  metrics.set_loss(0.0123);
  metrics.set_step_ms(50);
  EXPECT_EQ(ProgressView::ProgressLine(metrics, 80, 10),
            "[#####-----] 40/80  loss 0.0123  50.00 ms/step  ETA 0:00:02");
  metrics.set_step(200);  // never past the end
  EXPECT_EQ(ProgressView::ProgressLine(metrics, 80, 4).substr(0, 12), "[####] 80/80");
}

TEST(ProgressViewTest, ProgressLineTimesTheWholeIterationAndShowsThePeakRss) {
  v1::StepMetrics metrics;
  metrics.set_step(40);
  metrics.set_loss(0.0123);
  metrics.set_step_ms(50);
  metrics.set_compute_ms(100);
  metrics.set_iteration_ms(150);
  metrics.set_vmhwm_bytes(int64_t{768} << 20);
  EXPECT_EQ(ProgressView::ProgressLine(metrics, 80, 10),
            "[#####-----] 40/80  loss 0.0123  150.00 ms/iter  ETA 0:00:06  peak RSS 768.0 MiB");
}

TEST(ProgressViewTest, WithoutAFixedStepCountTheLineHasTheStepAloneAndNoEta) {
  v1::StepMetrics metrics;
  metrics.set_step(1234);
  metrics.set_loss(0.0123);
  metrics.set_step_ms(50);
  EXPECT_EQ(ProgressView::ProgressLine(metrics, 0, 10), "step 1234  loss 0.0123  50.00 ms/step");
  metrics.set_iteration_ms(150);
  metrics.set_vmhwm_bytes(int64_t{768} << 20);
  EXPECT_EQ(ProgressView::ProgressLine(metrics, 0, 10),
            "step 1234  loss 0.0123  150.00 ms/iter  peak RSS 768.0 MiB");

  std::ostringstream out;
  ProgressView view("job-000007", 0, /*terminal=*/false, &out);
  view.OnEvent(Progress(3, 0.5, 10));
  view.OnEvent(State(v1::SUCCEEDED, "all ranks finished"));
  EXPECT_EQ(out.str(),
            "job-000007 step 3  loss 0.5  10.00 ms/step\n"
            "job-000007 SUCCEEDED: all ranks finished\n");
}

TEST(ProgressViewTest, StepOfTotalLeavesOutAMissingTotal) {
  EXPECT_EQ(StepOfTotal(40, 80), "40/80");
  EXPECT_EQ(StepOfTotal(40, 0), "40");
  EXPECT_EQ(StepOfTotal(0, 0), "0");
}

TEST(ProgressViewTest, PlainOutputHasOneLinePerEvent) {
  std::ostringstream out;
  ProgressView view("job-000001", 2, /*terminal=*/false, &out);
  view.OnEvent(State(v1::RUNNING, "generation 1 on 2 workers"));
  view.OnEvent(Progress(1, 0.5, 10));
  view.OnEvent(Progress(2, 0.25, 10));
  view.OnEvent(State(v1::SUCCEEDED, "all ranks finished"));
  view.Close();
  EXPECT_EQ(view.final_state(), v1::SUCCEEDED);
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("job-000001 SUCCEEDED: all ranks finished\n"), std::string::npos);
}

TEST(ProgressViewTest, NoticesAndCheckpointsCloseTheBarAndGetALine) {
  std::ostringstream out;
  ProgressView view("job-000001", 2, /*terminal=*/true, &out);
  view.OnEvent(Progress(1, 0.5, 10));
  v1::JobEvent notice;
  notice.set_type(v1::NOTICE);
  notice.set_message("checkpoint at step 1 failed on rank 1: disk full");
  view.OnEvent(notice);
  v1::JobEvent checkpoint;
  checkpoint.set_type(v1::CHECKPOINT_COMMITTED);
  checkpoint.mutable_checkpoint()->set_step(2);
  view.OnEvent(checkpoint);
  EXPECT_NE(out.str().find("\njob-000001 notice: checkpoint at step 1 failed on rank 1: disk full\n"
                           "job-000001 checkpoint at step 2\n"),
            std::string::npos)
      << out.str();
}

TEST(ProgressViewTest, TerminalOutputRewritesOneLine) {
  std::ostringstream out;
  ProgressView view("job-000001", 2, /*terminal=*/true, &out);
  view.OnEvent(Progress(1, 0.5, 10));
  view.OnEvent(Progress(2, 0.25, 10));
  view.OnEvent(State(v1::FAILED, "worker lost"));
  EXPECT_EQ(view.final_state(), v1::FAILED);
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 2);
  EXPECT_NE(text.find("2/2"), std::string::npos);
  EXPECT_NE(text.find("\njob-000001 FAILED: worker lost\n"), std::string::npos);
}

TEST(ShardMapTest, ListsBucketsAndRanks) {
  v1::ShardPlan rank0;
  rank0.set_job_id("job-000001");
  rank0.set_world_size(2);
  rank0.set_bucket_count(1);
  rank0.set_plan_version(2);
  v1::PlanTensor* tensor = rank0.add_tensors();
  tensor->set_name("0.weight");
  tensor->set_bucket_count(2);  // spans buckets 0 and 1
  rank0.add_tensors()->set_name("0.bias");
  v1::PlanBucket* bucket = rank0.add_buckets();
  bucket->set_padded_elems(256);
  bucket->set_piece_elems(128);
  bucket->set_tensor_count(1);
  bucket->set_tensor_elems(256);
  v1::PlanPiece* piece = rank0.add_pieces();
  piece->set_flat_end(128);
  v1::PlanFragment* fragment = piece->add_fragments();
  fragment->set_end(10);
  v1::ShardPlan rank1;
  rank1.set_rank(1);
  rank1.add_pieces()->set_flat_begin(128);
  rank1.mutable_pieces(0)->set_flat_end(256);
  std::ostringstream out;
  PrintShardMap({rank0, rank1}, &out);
  const std::string text = out.str();
  EXPECT_NE(text.find("world_size 2"), std::string::npos);
  EXPECT_NE(text.find("plan version 2"), std::string::npos);
  EXPECT_NE(text.find("256          0.weight..."), std::string::npos) << text;
  EXPECT_NE(text.find("  0     1       128            10             1              512"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace zeroshard::client
