// Which tile shape the attention kernels run (FLASHGPT_ATTENTION_FWD_TILE,
// FLASHGPT_ATTENTION_BWD_TILE). Host-only, so the CPU tests check the rule
// (tests/test_tile_choice.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>
#include "src/errors.h"

namespace flashgpt::cuda::attn {

// The knob `var` set to `value` (null or empty: unset): 0 or 1, -1 when unset (each
// kernel's default: 0 everywhere but the sm90ws forward, see sm90ws_forward_tile);
// anything else is an InputError.
inline int parse_tile_choice(const char* var, const char* value) {
  if (!value || !*value) return -1;
  const std::string v = value;
  if (v != "0" && v != "1") fail_input(var, " must be 0 or 1, got '", v, "'");
  return v == "1" ? 1 : 0;
}

// The sm80 kernels' tile (forward and backward): the one requested, tile 0 when unset.
inline int sm80_tile(int requested) { return requested >= 0 ? requested : 0; }

// The sm90ws forward's one-consumer tile: one consumer warpgroup (64 query rows a block)
// and two blocks an SM (flash_fwd_sm90_ws.cu).
constexpr int kSm90WsOneConsumer = 2;

// The sm90ws forward's schedule knob, FLASHGPT_ATTENTION_FWD_SCHEDULE = auto | grid |
// persistent (null or empty: auto; anything else is an InputError): its two-consumer
// tiles, and the three-consumer one under a causal mask, as a block per query tile (grid)
// or one block an SM walking the query tiles (persistent, flash_fwd_sm90_ws.cu); the
// other tiles always run a block per tile.
enum class FwdSchedule { automatic, grid, persistent };
inline FwdSchedule parse_forward_schedule(const char* value) {
  const std::string v = value && *value ? value : "auto";
  if (v == "auto") return FwdSchedule::automatic;
  if (v == "grid") return FwdSchedule::grid;
  if (v == "persistent") return FwdSchedule::persistent;
  fail_input("FLASHGPT_ATTENTION_FWD_SCHEDULE must be auto, grid or persistent, got '", v, "'");
}

// The sm90ws forward's tile for head dim D, T tokens, causal or not; `requested` < 0
// (the knob unset) chooses. Measured on an H200 (BENCHMARKS.md, interleaved runs):
// - D = 128: tile 1 (176-key tiles, two stages; FlashAttention-3's tile without a mask)
//   without a mask from T = 8192 on, 1.6-3.9% ahead of tile 0 there; below it level to 4%
//   behind, and under a causal mask level to 4% behind ("Thirty-third session", call 2).
// - D = 64 without a mask: three consumers (tile 1, 192 query rows a block) from T = 320,
//   14-27% ahead of two ("Twelfth session", call 3) and of one consumer by 6% at 512 and
//   1K, 11% at 384, level at 448 where the last block holds 64 rows ("Thirty-seventh
//   session", call 3; "Thirty-eighth session", calls 6-7). Below T = 320 one consumer and
//   two blocks an SM (8% ahead at 256, level at 320): a block's first loads and its
//   epilogue run under the other block's matmuls.
// - D = 64 under a causal mask: three consumers from T = 2048, 8-16% ahead of two
//   ("Twelfth session", call 3), and from T = 384 where the three-consumer query tiles
//   number at least 5 an SM (ceil(T / 192) · pairs ≥ 5 · sms; pairs = B · H), once the
//   short tile came first (sm90ws_lead_shift; with it last, three consumers were 3-6%
//   behind two at 512-1K, "Sixty-first session", call 5). Measured on an H100 ("Sixty-second
//   session", calls 2-3; forward, three consumers against two): 64 x 12 x 1K +7%,
//   16 x 32 x 1K +3.5%, 16 x 12 x 1K +4%, 1K-1.8K at 684 pairs +7-14%, 384-896 at
//   1,000-2,000 pairs +1-16% (640: level); with fewer tiles behind, by 2-20% (192 pairs at
//   512 with 576 tiles, 96 pairs at 1K with 576, 12 and 48 pairs at 384-1K). Otherwise up
//   to T = 1024 tile 0 (two consumers) persistent, ahead of one consumer by 4-8%
//   ("Twenty-fifth session", call 5; "Thirty-eighth session", call 6); under the grid
//   schedule there, one consumer. `pairs` = 0 (unknown): two consumers below 2048.
inline int sm90ws_forward_tile(int requested, int D, int T, bool causal, FwdSchedule schedule = FwdSchedule::automatic,
                               int64_t pairs = 0, int sms = 132) {
  if (requested >= 0) return requested;
  if (D == 128) return !causal && T >= 8192 ? 1 : 0;
  if (!causal) return T < 320 ? kSm90WsOneConsumer : 1;
  if (T >= 2048) return 1;
  if (T <= 1024 && schedule == FwdSchedule::grid) return kSm90WsOneConsumer;
  return T >= 384 && int64_t((T + 191) / 192) * pairs >= 5 * int64_t(sms) ? 1 : 0;
}

// The consumer warpgroups and the key-tile size of the sm90ws forward's `tile` at head dim
// D (flash_fwd_sm90_ws.cu instantiates its tiles from these), and whether a tile has a
// persistent kernel: the tiles of 128 keys, two consumers and three (tile 1 at D = 64;
// without a mask only since the sixty-third session: before, it spilled 8 bytes there, or
// cost the two-consumer tiles 1% not to; BENCHMARKS.md, "Twenty-sixth session", calls 1
// and 4, and "Sixty-third session"). The 176-key tile (tile 1 at
// D = 128) runs a block per query tile: persistent, it spilled 8 bytes without a mask and
// ran 1-3% behind tile 0 at 1K and 2K ("Thirty-third session", call 2).
constexpr int sm90ws_consumers(int tile, int D) { return tile == kSm90WsOneConsumer ? 1 : tile == 1 && D == 64 ? 3 : 2; }
constexpr int sm90ws_block_n(int tile, int D) {
  return D == 128 && tile == kSm90WsOneConsumer ? 64 : D == 128 && tile == 1 ? 176 : 128;
}
constexpr bool sm90ws_has_persistent_kernel(int consumers, int block_n) {
  return block_n <= 128 && (consumers == 2 || consumers == 3);
}
// Whether the persistent kernel of `consumers` consumer warpgroups claims its query tiles
// from a counter (FLASHGPT_ATTENTION_FWD_HEAD_GROUP, below): three consumers only; the
// two-consumer kernels walk the rounds (flash_fwd_sm90_ws.cu says why). The launch sets
// the counter up by it and the kernel compiles the claims by it.
constexpr bool sm90ws_claims_tiles(int consumers) { return consumers == 3; }

// The consumers of an sm90ws grid block whose query tile holds rows m0 .. end − 1 that
// have rows there (64 rows a consumer, `consumers` of them): all of them but in a
// sequence's short query tile (T = 1024 in 192-row blocks: 64 rows, one). The grid kernel
// starts only these (flash_fwd_sm90_ws.cu); constexpr, so device code calls it.
constexpr int sm90ws_busy_consumers(int end, int m0, int consumers) { return std::min(consumers, (end - m0 + 63) / 64); }

// Under a causal mask the three-consumer forward puts a sequence's short query tile first:
// T in 64-row slabs, rounded up, is not always a multiple of a block's three, and the
// short tile at the end held the longest rows (T = 1024: 64 rows against all 8 key tiles,
// one consumer busy on the SM for 8 steps), at the start it holds the shortest (T = 1024:
// rows 0-63, one key tile). Query tile m_block holds rows max(0, m_block·BM − shift) up to
// (m_block + 1)·BM − shift (and T), with shift = sm90ws_lead_shift(T, BM): 0, or 64 or 128
// rows at three consumers. The tiles number as many as without it, each consumer's rows
// see the same key tiles (64-row slabs, 128-key tiles): the same bits. Only blocks that
// skip key tiles shift (sm90ws_skips_key_tiles).
constexpr int sm90ws_lead_shift(int T, int BM) {
  const int per = BM / 64, slabs = (T + 63) / 64;
  return 64 * ((per - slabs % per) % per);
}
constexpr int sm90ws_tile_m0(int m_block, int BM, int shift) { return std::max(0, m_block * BM - shift); }
constexpr int sm90ws_tile_end(int m_block, int BM, int shift, int T) { return std::min(T, (m_block + 1) * BM - shift); }
// Whether blocks of BM query rows over BN-key tiles skip the key tiles their first
// consumers see none of (sm90ws_consumer_key_tiles, below) and so put the short tile
// first: under a causal mask, blocks taller than their key tiles (three consumers).
constexpr bool sm90ws_skips_key_tiles(bool causal, int BM, int BN) { return causal && BM > BN; }
// Query tile m_block's first row and its end (one past its last row) in the sm90ws forward
// kernels and the persistent schedule's model: with `skips` (the above) the short tile
// first, else m_block·BM on (written apart: the shift for every kernel made the
// two-consumer ones 1-1.5% slower, BENCHMARKS.md "Sixty-second session", call 5).
constexpr int sm90ws_first_row(bool skips, int m_block, int BM, int T) {
  return skips ? sm90ws_tile_m0(m_block, BM, sm90ws_lead_shift(T, BM)) : m_block * BM;
}
constexpr int sm90ws_row_end(bool skips, int m_block, int BM, int T) {
  return skips ? sm90ws_tile_end(m_block, BM, sm90ws_lead_shift(T, BM), T) : std::min(m_block * BM + BM, T);
}

// Without a mask the short tile stays last (T = 1024 in 192-row blocks: rows 960-1023,
// all 8 key tiles), and with the rows of one consumer alone it would keep that consumer
// busy on its SM for every key tile while the others wait. There the three consumers split
// the key tiles instead: consumer c runs the same 64 rows over key tiles c, c + 3, ...,
// and the first merges the three partial outputs (the three-consumer grid kernel,
// flash_fwd_sm90_ws.cu). busy: sm90ws_busy_consumers of the tile.
constexpr bool sm90ws_splits_keys(bool causal, int consumers, int busy) { return !causal && consumers == 3 && busy == 1; }
// Whether the three-consumer grid kernel splits the key tiles of a sequence's last query
// tile without a mask: T mod 192 from 1 to 64 (T = 1024: rows 960-1023).
constexpr bool sm90ws_splits_last_tile(int T) {
  return sm90ws_splits_keys(false, 3, sm90ws_busy_consumers(T, (T - 1) / 192 * 192, 3));
}
// In a split tile (three ring stages) a consumer's key tiles share one stage, and V of key
// tile j waits for the P·V of j − 3, which that consumer issues with its QKᵀ of j: a K that
// the producer queued behind that V would reach the next consumer late. So after K of key
// tile nb the producer loads V of sm90ws_split_v_at(nb) (-1: none): V of nb itself for the
// first three (their stages' previous V is an earlier tile's, released early), then V of
// nb − 3 from nb = 6 (free about when K of nb is: once the QKᵀ of nb − 3 is done), and
// after the tile's last K the rest, from sm90ws_split_v_tail. (Until the sixty-fourth
// session, V of nb − 1 after K of nb.)
constexpr int sm90ws_split_v_at(int nb) { return nb < 3 ? nb : nb >= 6 ? nb - 3 : -1; }
constexpr int sm90ws_split_v_tail(int n_blocks) { return n_blocks - 3 > 3 ? n_blocks - 3 : 3; }

// Under a causal mask a block of more query rows than a key tile holds (three consumers,
// 192 rows, against 128 keys) has key tiles that its first consumers see none of: consumer
// c (rows m0 + 64c .. m0 + 64c + 63) sees the keys up to its last row, so it needs only
// the block's first sm90ws_consumer_key_tiles key tiles, and key tile nb is needed by the
// consumers from sm90ws_first_consumer_of(nb) on (the others' rows all come before its
// first key). At T = 2048 these skip 10% of the three-consumer persistent kernel's
// consumer steps, at 1024 25%. m0 and BN are multiples of 64. The kernels skip only where
// the block is taller than its key tiles (flash_fwd_sm90_ws.cu); n_blocks: the block's key
// tiles.
constexpr int sm90ws_consumer_key_tiles(int m0, int c, int BN, int n_blocks) {
  return std::min(n_blocks, (m0 + 64 * (c + 1) + BN - 1) / BN);
}
constexpr int sm90ws_first_consumer_of(int nb, int BN, int m0) { return std::max(0, (nb * BN - m0) / 64); }
// The turns' view of it (flash_fwd_sm90_ws.cu): after key tile nb the last consumer
// hands the turn to named barrier 1 + sm90ws_first_consumer_of(nb + 1, BN, m0), computed
// as sm90ws_next_turn(nb, BN, sm90ws_turn_offset(BN, m0)) with the offset worked out once
// a query tile (in the loop, the division by 64 and m0 kept live spilled 8 bytes in the
// three-consumer grid kernel).
constexpr int sm90ws_turn_offset(int BN, int m0) { return 1 + (BN - m0) / 64; }
constexpr int sm90ws_next_turn(int nb, int BN, int turn_offset) { return std::max(1, BN / 64 * nb + turn_offset); }

// Whether the sm90ws forward runs `tile` persistent: never a tile without a persistent
// kernel (above). auto: persistent at D = 128 up to T = 2048 under a causal mask and up to
// 4096 without one, and under a causal mask up to T = 16384 at D = 64, where a block per
// tile, alone on its SM, pays its tile's first loads and its epilogue in the open (cuDNN's
// forward is persistent there). Measured on an H200 against a block per tile
// (BENCHMARKS.md, interleaved runs):
// - D = 128: 1.3-8% ahead at 1K and 2K with both masks; without a mask level at 4K once
//   the persistent kernel staged O ("Thirty-sixth session", call 5); under a causal mask
//   behind from 4K, by 1.6-3.3% there and 9% at 16K ("Twenty-fifth session", call 5;
//   "Twenty-sixth session", call 1).
// - D = 64, causal, three consumers: 7-10% ahead at 2K, 4-7% at 4K, 1% at 8K
//   ("Twenty-sixth session", call 1) and, with its tiles claimed in groups of 64 pairs,
//   2.6% at 16K; 2-7% behind at 65,536 ("Forty-first session", call 4). Up to 1K, see sm90ws_forward_tile.
// - D = 64, no mask, three consumers (T from 320): persistent below T = 1024 where the
//   sequence's last query tile has more than one consumer's rows (T mod 192 = 0 or above
//   64); a last tile of one consumer's rows splits its key tiles in the grid kernel
//   (sm90ws_splits_keys), which the persistent kernel does not. On an H100 at 192, 512 and
//   1,536 (batch, head) pairs ("Sixty-third session", call 3): 4-18% ahead at 320 and 384,
//   3-8% at 512, 4.5-8% at 768, -1 to +2.5% at 896; with a one-consumer last tile 1-5%
//   behind at 448 and 640 and 2-4% at 1K, 2% at 2K (128 rows, call 2).
inline bool sm90ws_forward_persistent(FwdSchedule schedule, int tile, int D, int T, bool causal) {
  if (!sm90ws_has_persistent_kernel(sm90ws_consumers(tile, D), sm90ws_block_n(tile, D)) ||
      schedule == FwdSchedule::grid)
    return false;
  if (schedule == FwdSchedule::persistent) return true;
  if (D == 128) return T <= (causal ? 2048 : 4096);
  if (causal) return T <= 16384;
  return sm90ws_consumers(tile, D) == 3 && T < 1024 && !sm90ws_splits_last_tile(T);
}

// The persistent forward's rounds (flash_fwd_sm90_ws.cu, tile_of): with G blocks, round r
// is tiles rG .. rG + G − 1, block i taking the i-th of them in even rounds and the
// (G − 1 − i)-th in odd ones. A tile is a query tile of kBlockM rows, (batch, head) major,
// each head's last query tile first; it costs its key tiles (a causal mask: those up to
// its diagonal):
inline int64_t persistent_forward_tile_cost(int64_t t, int64_t m_blocks, int T, int BM, int BN, bool causal) {
  const int m_block = int(m_blocks - 1 - t % m_blocks);
  const int64_t n_end = causal ? sm90ws_row_end(sm90ws_skips_key_tiles(causal, BM, BN), m_block, BM, T) : T;
  return (n_end + BN - 1) / BN;
}
// The list's price of a tile (persistent_forward_schedule), in half key tiles: its key
// tiles and half a key tile for its Q load and epilogue.
inline int64_t persistent_forward_list_cost(int64_t t, int64_t m_blocks, int T, int BM, int BN, bool causal) {
  return 2 * persistent_forward_tile_cost(t, m_blocks, T, BM, BN, causal) + 1;
}
// The block that takes tile t (t < rounds·G) in the rounds.
constexpr int64_t persistent_forward_round_block(int64_t t, int64_t G) {
  return (t / G) % 2 == 0 ? t % G : G - 1 - t % G;
}
// The most loaded block's key tiles, for `heads` (batch, head) pairs:
inline int64_t persistent_forward_max_load(int64_t G, int64_t heads, int T, int BM, int BN, bool causal) {
  const int64_t m_blocks = (T + BM - 1) / BM, tiles = m_blocks * heads;
  std::vector<int64_t> load(size_t(G), 0);
  for (int64_t t = 0; t < tiles; ++t)
    load[size_t(persistent_forward_round_block(t, G))] += persistent_forward_tile_cost(t, m_blocks, T, BM, BN, causal);
  return *std::max_element(load.begin(), load.end());
}

// The three-consumer persistent forward's claimed schedule (FLASHGPT_ATTENTION_FWD_HEAD_GROUP
// = N > 0, below; 0: the rounds above). Block i takes the i-th tile of the order below
// first, and every later tile from a counter (the next unclaimed one), so that a block
// that drew short tiles takes more of them. The order: the (batch, head) pairs in groups
// of `group`, group by group, and within a group rank by rank: every pair's last query
// tile (the longest under a causal mask), then every pair's one before, and so on. Returns
// the claim-order index k's tile in the rounds' numbering t (pair bh's query tile
// m_blocks − 1 − r is t = bh·m_blocks + r). group = 1 is the rounds' order (t = k).
constexpr int grouped_tile(int k, int heads, int m_blocks, int group) {
  const int per_group = group * m_blocks, g = k / per_group, first = g * group;
  const int n = std::min(group, heads - first), i = k - g * per_group;
  return (first + i % n) * m_blocks + i / n;
}
// FLASHGPT_ATTENTION_FWD_HEAD_GROUP for the three-consumer persistent kernel (the only one
// that claims): auto (or unset), 0 (the rounds), a positive number of pairs, or `all`
// (every pair in one group). auto: under a causal mask from T = 2048 groups of 64 pairs
// (on an H200 0.4-5.5% faster than the rounds at 2K-16K, "Forty-first session"; on an
// H100 3.7% at 16K, 0.7-2.1% slower at 2K and 4K, "Sixty-fourth session", call 9);
// elsewhere the rounds: without a mask, where every tile costs the same, 0-4% ahead of
// groups of 64 at T = 320-1K on an H100 ("Sixty-third session", call 3), and under a
// causal mask up to 1K 1.7% ahead at 128 x 12 x 512 and 2-6% at 1K (16 x 12 5.9-6.4%,
// 16 x 32 2.7-3.1%, GPT-2's 64 x 12 1.9%) on an H100 ("Sixty-fourth session", calls 8
// and 9; not measured on an H200).
inline int forward_head_group(const char* value, int64_t heads, bool causal, int T) {
  const std::string v = value && *value ? value : "auto";
  const int64_t pairs = std::max<int64_t>(heads, 1);
  if (v == "auto") return causal && T > 1024 ? int(std::min<int64_t>(64, pairs)) : 0;
  if (v == "0") return 0;
  if (v == "all") return int(pairs);
  const int64_t g =
      parse_positive_int(v, "FLASHGPT_ATTENTION_FWD_HEAD_GROUP", "auto, 0, all or a positive integer", INT32_MAX);
  return int(std::min<int64_t>(g, pairs));
}

// The persistent forward's grid on up to `max_blocks` blocks, and never more than the
// tiles (top = the smaller): under a causal mask the G in [top / 2, top] whose most loaded
// block has the fewest key tiles (the largest such G on a tie); without a mask, top.
// O(tiles) for each G: callers keep the answer. Against 132 blocks in call 2 of the
// twenty-sixth session: 8 x 32 x 2K D = 64 (131 blocks) 381-385 TFLOP/s against 360-370,
// 2 x 32 x 8K (129) 482-484 against 430-433, 4 x 32 x 4K (131) level.
// At 1 x 16 x 16K causal (128 query tiles a head, D = 128) 132 blocks leave the most
// loaded block 1.54x the mean (a round is a head and 4 tiles of the next), which cost the
// persistent kernel 39% there (BENCHMARKS.md, "Twenty-fifth session"); 128 blocks (a
// round is a head) load every block alike.
inline int persistent_forward_grid(int max_blocks, int64_t heads, int T, int BM, int BN, bool causal) {
  const int64_t tiles = (T + BM - 1) / BM * heads;
  const int64_t top = std::min<int64_t>(std::max(max_blocks, 1), tiles);
  if (!causal) return int(top);  // equal tiles: no fewer blocks does better
  int64_t best = top, best_load = persistent_forward_max_load(top, heads, T, BM, BN, causal);
  for (int64_t G = top - 1; G >= std::max<int64_t>(1, top / 2); --G) {
    const int64_t load = persistent_forward_max_load(G, heads, T, BM, BN, causal);
    if (load < best_load) best = G, best_load = load;
  }
  return int(best);
}

// The persistent forward's list after the rounds (flash_fwd_sm90_ws.cu, tile_of). Under a
// causal mask the rounds leave the blocks' loads uneven by up to a long tile: on 132
// blocks the busiest has 215 key tiles against a mean of 209.5 at GPT-2's 64 × 12 × 1K, 144
// against 139.6 at 16 × 32 × 1K. So the rounds may stop after `rounds` of them, and the
// tiles from rounds·G on go out as a list: longest first, each to the block with the
// least work so far, at most kTailSlots a block (210 and 140 key tiles there), a tile
// priced by persistent_forward_list_cost. The list is a kernel parameter, read from the
// constant bank at a warp-uniform index: a tile index read from
// memory the kernel writes took the two-consumer kernels' wgmma descriptors out of the
// uniform registers, and a 30 KB table of every block's tiles cost a few microseconds a
// launch (BENCHMARKS.md, "Forty-first session"). Hopper GPUs have at most 132 SMs; a grid
// of more blocks runs the rounds alone.
constexpr int kTailSlots = 3, kTailMaxBlocks = 132;
struct ForwardTail {
  int rounds;                                // rounds before the list; INT32_MAX: no list
  int16_t tile[kTailMaxBlocks][kTailSlots];  // block i's list, tiles less rounds·G; −1 past its end
};
struct PersistentSchedule {
  int blocks;
  ForwardTail tail;
};
// Block `block`'s local-th tile of `tiles` on a grid of G, or −1 past its last: round
// `local` taken forwards or backwards (persistent_forward_round_block), or after
// tail.rounds rounds the block's list. (The kernel's tile_of, and the tests'.)
constexpr int persistent_forward_tile(const ForwardTail& tail, int local, int block, int G, int tiles) {
  if (local >= tail.rounds) {
    const int j = local - tail.rounds, e = j < kTailSlots ? tail.tile[block][j] : -1;
    return e < 0 ? -1 : tail.rounds * G + e;
  }
  const int t = local * G + (local % 2 == 0 ? block : G - 1 - block);
  return t < tiles ? t : -1;
}
// FLASHGPT_ATTENTION_FWD_TAIL = auto (or unset): the list wherever it balances the blocks
// better than the rounds alone; off: the rounds alone.
inline bool forward_tail_list(const char* value) {
  const std::string v = value && *value ? value : "auto";
  if (v != "auto" && v != "off") fail_input("FLASHGPT_ATTENTION_FWD_TAIL must be auto or off, got '", v, "'");
  return v == "auto";
}
// The schedule on up to `max_blocks` blocks (exactly min(max_blocks, tiles) with `exact`):
// the rounds on persistent_forward_grid's G, or with `list`, under a causal mask, G = the
// most blocks and the list after R of the last four rounds, the R whose busiest block has
// the least work (the latest R on a tie), if that beats the rounds alone.
inline PersistentSchedule persistent_forward_schedule(int max_blocks, int64_t heads, int T, int BM, int BN,
                                                      bool causal, bool exact, bool list) {
  PersistentSchedule s{};
  s.tail.rounds = INT32_MAX;
  for (auto& row : s.tail.tile) std::fill(std::begin(row), std::end(row), int16_t(-1));
  const ForwardTail empty = s.tail;  // no list
  const int64_t m_blocks = (T + BM - 1) / BM, tiles = m_blocks * heads;
  const int64_t top = std::min<int64_t>(std::max(max_blocks, 1), tiles);
  s.blocks = exact ? int(top) : persistent_forward_grid(max_blocks, heads, T, BM, BN, causal);
  if (!list || !causal || top > kTailMaxBlocks) return s;
  auto cost = [&](int64_t t) { return persistent_forward_list_cost(t, m_blocks, T, BM, BN, causal); };
  auto rounds_load = [&](int64_t G, int64_t R) {  // the blocks' loads after R rounds (half key tiles)
    std::vector<int64_t> load(size_t(G), 0);
    for (int64_t t = 0; t < std::min(tiles, R * G); ++t) load[size_t(persistent_forward_round_block(t, G))] += cost(t);
    return load;
  };
  const std::vector<int64_t> alone = rounds_load(s.blocks, tiles);
  int64_t best = *std::max_element(alone.begin(), alone.end());
  const int64_t G = top, full = tiles / G;
  for (int64_t R = full - 1; R >= std::max<int64_t>(0, full - 4); --R) {
    std::vector<int64_t> load = rounds_load(G, R), order(size_t(tiles - R * G));
    for (size_t i = 0; i < order.size(); ++i) order[i] = R * G + int64_t(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost(a) > cost(b); });
    ForwardTail tail = empty;  // (not s.tail: an R taken before would leave its entries)
    std::vector<int> used(size_t(G), 0);
    bool fits = true;
    for (const int64_t t : order) {
      const size_t b = size_t(std::min_element(load.begin(), load.end()) - load.begin());
      if (used[b] == kTailSlots) { fits = false; break; }
      tail.tile[b][used[b]++] = int16_t(t - R * G);
      load[b] += cost(t);
    }
    const int64_t busiest = *std::max_element(load.begin(), load.end());
    if (fits && busiest < best) {
      best = busiest;
      s.blocks = int(G);
      s.tail = tail;
      s.tail.rounds = int(R);
    }
  }
  return s;
}

}  // namespace flashgpt::cuda::attn
