// Padding-free batches: an unpacked (B, T) batch re-laid as rows that hold only the real tokens of
// its samples, one after the other (HF TRL's `padding_free`, bounded by a row length).
//
// The unpacked collation right-pads every row to the longest sample (data_loader.h: doc id 0 for
// the sample, 1 for its padding). The padded positions carry no label, and under causal attention
// no real token sees them, so computing them is pure waste. remove_padding() keeps what the padded
// batch means: each sample keeps its tokens, labels and positions (0..L-1), and its row index in
// the padded batch becomes its document id, so attention stays inside the sample exactly as with
// packed batches. The loss and every gradient are the same up to float rounding
// (tests/model/padding_free_parity_test.cpp). One thing does move: LoRA dropout masks are drawn per
// element of the laid-out input, so a re-laid batch draws other masks than its padded form (another
// draw of the same distribution).
//
// max_row_len >= ΣL gives a single row (B = 1, T = ΣL, no padding left at all: the recipe's
// default). The CPU attention narrows by document both ways (the forward's keys start at the
// query's document, the backward's queries end at the key tile's documents:
// src/kernels/cpu/attention.cpp), so the row's attention costs Σ L_b² plus what tiles that straddle
// two samples mask, not (ΣL)². With max_row_len = T (KTUNE_PADDING_FREE=rows) no row is longer
// than the padded batch's rows and there are no more of them, but what first-fit cannot fill stays
// padding.
//
// Labels must be shifted per row BEFORE the batch is re-laid (shift_labels): a sample's last real
// token is then labelled -100 by its own padding, never by the next sample's first.
// Deliberately not here: packed batches (already one document per sample, T fixed at max_seq_len),
// left padding, and deciding when to use it (the recipe does).
#pragma once

#include "data/data_loader.h"

namespace ktune {

// padded: (B, T) unpacked, each row's sample a prefix of doc id 0 and the rest padding (doc id != 0).
// Returns (R, T') with R <= B rows: the samples placed longest first, each into the first row with
// room for it (first-fit decreasing, at most max_row_len tokens a row; max_row_len must hold the
// longest sample), T' the fullest row's length. A sample's tokens, labels and positions are copied
// from its row's prefix and its doc id is that row's index b; what is left of a row after its
// samples is padding: the padded batch's padding token, label -100, position 0, doc id -1. Empty
// samples take no place; a batch with no tokens at all gives (1, 0). epoch and index are kept.
// A padded position whose label is not -100 would lose loss silently, so it is refused, as is a row
// whose padding is followed by sample tokens (ktune::Error naming the row and position).
Batch remove_padding(const Batch& padded, int64_t max_row_len);

}  // namespace ktune
