#include "train/progress_bar.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace ktune;

TEST(ProgressBar, RendersTorchtunesTqdmLine) {
  EXPECT_EQ(render_progress(1, 52, 2.3697, 52, 25880, 24.0),
            "1|52|Loss: 2.3697:   0%|          | 52/25880 [00:24<3:18:41,  2.17it/s]");
  EXPECT_EQ(render_progress(2, 10, 0.5, 10, 10, 5.0), "2|10|Loss: 0.5000: 100%|██████████| 10/10 [00:05<00:00,  2.00it/s]");
}

TEST(ProgressBar, DrawsEighthBlocksForPartialCells) {
  // 13% of 10 cells: one full block and three eighths of the next.
  EXPECT_EQ(render_progress(1, 13, 1.0, 13, 100, 13.0), "1|13|Loss: 1.0000:  13%|█▎        | 13/100 [00:13<01:27,  1.00it/s]");
}

TEST(ProgressBar, FormatsIntervalsAsTqdmDoes) {
  EXPECT_EQ(format_interval(24), "00:24");
  EXPECT_EQ(format_interval(14101), "3:55:01");
}

TEST(ProgressBar, PrintsPlainLinesWhenNotATerminal) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  ProgressBar bar(out, /*interactive=*/false, 4);
  bar.update(1, 1, 3.0, 1, 1.0);
  bar.update(1, 2, 2.0, 2, 2.0);
  bar.finish();
  std::fclose(out);
  std::string text(buffer, size);
  free(buffer);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
}
