// RadixCache: page-aligned match and insert, the overlap contract of insert, splits under locks,
// LRU eviction that respects locks and frees parents after children, reset, and a randomized run
// checked against a brute-force model of cached page prefixes (which also catches slot leaks and
// double frees through the allocator's counts).
#include "specula/kv/radix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>

#include "specula/core/error.h"
#include "specula/kv/token_allocator.h"

namespace specula {
namespace {

using Key = std::vector<RadixKey>;
using Slots = std::vector<int32_t>;

Slots take(PagedTokenAllocator& allocator, int64_t num_tokens) {
  auto slots = allocator.alloc(num_tokens);
  if (!slots) throw std::runtime_error("the test's allocator ran out of slots");
  return *slots;
}

// Distinct keys first, first + 1, ..., so unrelated sequences share nothing. Keys span 64 bits
// (speculative bigrams do), so the high half is set: a key truncated to 32 bits would collide.
Key seq(int32_t first, int n) {
  Key t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (RadixKey{i % 3 + 1} << 40) + first + i;
  return t;
}

template <typename T>
std::vector<T> cat(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> t = a;
  t.insert(t.end(), b.begin(), b.end());
  return t;
}

template <typename T>
std::vector<T> sub(const std::vector<T>& t, int64_t begin, int64_t end) {
  return std::vector<T>(t.begin() + begin, t.begin() + end);
}

class RadixCacheTest : public ::testing::TestWithParam<int> {
 protected:
  int ps = GetParam();
  PagedTokenAllocator allocator{256 * GetParam(), GetParam()};
  const int64_t capacity = allocator.available_size();
  RadixCache cache{allocator, GetParam()};

  // Inserts key with fresh slots the way the scheduler does, freeing the duplicates.
  Slots insert_fresh(const Key& key) {
    Slots slots = take(allocator, static_cast<int64_t>(key.size()));
    const int64_t cached = cache.insert(key, slots);
    allocator.free(std::span<const int32_t>(slots).first(static_cast<size_t>(cached)));
    return slots;
  }
};

TEST_P(RadixCacheTest, InsertThenMatchReturnsTheInsertedSlots) {
  const Key key = seq(100, 3 * ps);
  const Slots slots = take(allocator, 3 * ps);
  EXPECT_EQ(cache.insert(key, slots), 0);
  EXPECT_EQ(cache.total_size(), 3 * ps);
  EXPECT_EQ(cache.evictable_size(), 3 * ps);
  EXPECT_EQ(cache.protected_size(), 0);

  const auto match = cache.match_prefix(key);
  EXPECT_EQ(match.slots, slots);
  EXPECT_NE(match.last_node, cache.root());

  const auto longer = cache.match_prefix(cat(key, seq(900, 2 * ps)));
  EXPECT_EQ(longer.slots, slots);
  EXPECT_EQ(longer.last_node, match.last_node);

  const auto unrelated = cache.match_prefix(seq(500, 3 * ps));
  EXPECT_TRUE(unrelated.slots.empty());
  EXPECT_EQ(unrelated.last_node, cache.root());
  EXPECT_EQ(cache.match_prefix(Key{}).last_node, cache.root());
  EXPECT_EQ(allocator.available_size(), capacity - 3 * ps);
}

TEST_P(RadixCacheTest, PartialMatchIsTruncatedToWholePages) {
  const Key key = seq(100, 3 * ps);
  const Slots slots = take(allocator, 3 * ps);
  cache.insert(key, slots);

  // Two whole pages and half of the third: only the whole pages count.
  const auto partial = cache.match_prefix(sub(key, 0, 2 * ps + ps / 2));
  EXPECT_EQ(partial.slots, sub(slots, 0, 2 * ps));
  // A third page that differs only in its last token does not match at all.
  Key last_differs = key;
  last_differs.back() = -5;
  const auto two_pages = cache.match_prefix(last_differs);
  EXPECT_EQ(two_pages.slots, sub(slots, 0, 2 * ps));
  // So does one whose last key differs only in its high 32 bits (a bigram's first token).
  Key high_differs = key;
  high_differs.back() ^= RadixKey{1} << 50;
  EXPECT_EQ(cache.match_prefix(high_differs).slots, sub(slots, 0, 2 * ps));
  EXPECT_EQ(two_pages.last_node, partial.last_node);
  // Less than one page matches nothing.
  EXPECT_TRUE(cache.match_prefix(sub(key, 0, ps - 1)).slots.empty());

  // The split made by the partial match changes neither the sizes nor the full match.
  EXPECT_EQ(cache.total_size(), 3 * ps);
  EXPECT_EQ(cache.evictable_size(), 3 * ps);
  const auto full = cache.match_prefix(key);
  EXPECT_EQ(full.slots, slots);
  EXPECT_NE(full.last_node, partial.last_node);
}

TEST_P(RadixCacheTest, InsertReturnsTheAlreadyCachedPrefix) {
  const Key a = seq(100, 4 * ps);
  const Slots slots_a = take(allocator, 4 * ps);
  EXPECT_EQ(cache.insert(a, slots_a), 0);

  // b shares a's first two pages.
  const Key b = cat(sub(a, 0, 2 * ps), seq(700, 2 * ps));
  const Slots slots_b = take(allocator, 4 * ps);
  const int64_t cached = cache.insert(b, slots_b);
  EXPECT_EQ(cached, 2 * ps);
  allocator.free(sub(slots_b, 0, cached));
  EXPECT_EQ(cache.total_size(), 6 * ps);
  EXPECT_EQ(allocator.available_size(), capacity - 6 * ps);
  EXPECT_EQ(cache.match_prefix(a).slots, slots_a);
  EXPECT_EQ(cache.match_prefix(b).slots, cat(sub(slots_a, 0, 2 * ps), sub(slots_b, 2 * ps, 4 * ps)));

  // c diverges from a in the middle of its second page: only the first page is shared.
  Key c = cat(sub(a, 0, ps + ps / 2), seq(-900, 2 * ps - ps / 2));
  const Slots slots_c = take(allocator, 3 * ps);
  const int64_t cached_c = cache.insert(c, slots_c);
  EXPECT_EQ(cached_c, ps);
  allocator.free(sub(slots_c, 0, cached_c));
  EXPECT_EQ(cache.match_prefix(c).slots, cat(sub(slots_a, 0, ps), sub(slots_c, ps, 3 * ps)));
  EXPECT_EQ(cache.total_size(), 8 * ps);

  // Re-inserting a cached key, or a prefix of one, adds nothing.
  const Slots again = take(allocator, 4 * ps);
  EXPECT_EQ(cache.insert(a, again), 4 * ps);
  allocator.free(again);
  const Slots prefix_slots = take(allocator, ps);
  EXPECT_EQ(cache.insert(sub(b, 0, ps), prefix_slots), ps);
  allocator.free(prefix_slots);
  EXPECT_EQ(cache.total_size(), 8 * ps);
  EXPECT_EQ(allocator.available_size(), capacity - 8 * ps);
}

TEST_P(RadixCacheTest, SplitKeepsALockedHandleValid) {
  const Key a = seq(100, 4 * ps);
  const Slots slots_a = take(allocator, 4 * ps);
  cache.insert(a, slots_a);
  const auto locked = cache.match_prefix(a);
  cache.inc_lock_ref(locked.last_node);
  EXPECT_EQ(cache.protected_size(), 4 * ps);
  EXPECT_EQ(cache.evictable_size(), 0);

  // Splits a's node after two pages; the new parent inherits the lock.
  const Key b = cat(sub(a, 0, 2 * ps), seq(700, 2 * ps));
  const Slots slots_b = insert_fresh(b);
  EXPECT_EQ(cache.protected_size(), 4 * ps);
  EXPECT_EQ(cache.evictable_size(), 2 * ps);

  // Only b's own pages can go.
  EXPECT_EQ(cache.evict(1000 * ps), 2 * ps);
  EXPECT_EQ(cache.match_prefix(b).slots, sub(slots_a, 0, 2 * ps));
  const auto again = cache.match_prefix(a);
  EXPECT_EQ(again.slots, slots_a);
  EXPECT_EQ(again.last_node, locked.last_node);

  cache.dec_lock_ref(locked.last_node);
  EXPECT_EQ(cache.protected_size(), 0);
  EXPECT_EQ(cache.evictable_size(), 4 * ps);
  EXPECT_EQ(cache.evict(1000 * ps), 4 * ps);
  EXPECT_EQ(cache.total_size(), 0);
  EXPECT_EQ(allocator.available_size(), capacity);
}

TEST_P(RadixCacheTest, EvictTakesTheLeastRecentlyUsedUnlockedLeaf) {
  std::vector<Key> keys;
  std::vector<Slots> slots;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(seq(1000 * (i + 1), 2 * ps));
    slots.push_back(take(allocator, 2 * ps));
    cache.insert(keys.back(), slots.back());
  }
  cache.match_prefix(keys[0]);  // keys[0] is now the newest
  const auto held = cache.match_prefix(keys[2]);
  cache.inc_lock_ref(held.last_node);  // age order of the unlocked ones: 1, 3, 0
  EXPECT_EQ(cache.protected_size(), 2 * ps);
  EXPECT_EQ(cache.evictable_size(), 6 * ps);

  for (int expected : {1, 3, 0}) {
    const int64_t before = allocator.available_size();
    EXPECT_EQ(cache.evict(1), 2 * ps);
    EXPECT_EQ(allocator.available_size(), before + 2 * ps);
    EXPECT_TRUE(cache.match_prefix(keys[static_cast<size_t>(expected)]).slots.empty())
        << "key " << expected << " should have been evicted";
    // Its slots are back in the allocator: freeing them again is a double free.
    EXPECT_THROW(allocator.free(slots[static_cast<size_t>(expected)]), Error);
  }
  EXPECT_EQ(cache.evict(1), 0) << "only the locked key is left";
  EXPECT_EQ(cache.match_prefix(keys[2]).slots, slots[2]);
  EXPECT_EQ(cache.total_size(), 2 * ps);

  cache.dec_lock_ref(held.last_node);
  EXPECT_EQ(cache.evict(1), 2 * ps);
  EXPECT_EQ(allocator.available_size(), capacity);
}

TEST_P(RadixCacheTest, EvictStopsOnceEnoughIsFreed) {
  for (int i = 0; i < 3; ++i) insert_fresh(seq(1000 * (i + 1), ps));
  EXPECT_EQ(cache.evict(ps + 1), 2 * ps);
  EXPECT_EQ(cache.total_size(), ps);
  EXPECT_EQ(cache.match_prefix(seq(3000, ps)).slots.size(), static_cast<size_t>(ps));
  EXPECT_EQ(cache.evict(0), 0);
  EXPECT_EQ(cache.total_size(), ps);
}

TEST_P(RadixCacheTest, EvictFreesParentsAfterChildren) {
  // A chain of three one-page nodes built by extending the same key; the parents are older than
  // their children, so plain LRU over all nodes would take the root page first.
  const Key key = seq(100, 3 * ps);
  Slots slots;
  for (int pages = 1; pages <= 3; ++pages) {
    slots = cat(slots, take(allocator, ps));
    EXPECT_EQ(cache.insert(sub(key, 0, pages * ps), slots), (pages - 1) * ps);
  }
  for (int left = 2; left >= 0; --left) {
    EXPECT_EQ(cache.evict(1), ps);
    EXPECT_EQ(cache.match_prefix(key).slots, sub(slots, 0, left * ps));
  }
  EXPECT_EQ(cache.total_size(), 0);

  // One call can free a whole branching subtree, reaching parents as their children go.
  const Key a = seq(100, 3 * ps);
  insert_fresh(a);
  insert_fresh(cat(sub(a, 0, ps), seq(500, 2 * ps)));
  insert_fresh(cat(sub(a, 0, 2 * ps), seq(800, ps)));
  EXPECT_EQ(cache.total_size(), 6 * ps);
  EXPECT_EQ(cache.evict(1000 * ps), 6 * ps);
  EXPECT_EQ(cache.total_size(), 0);
  EXPECT_EQ(allocator.available_size(), capacity);
}

TEST_P(RadixCacheTest, ResetFreesEverythingButNotWhileLocked) {
  const Key a = seq(100, 4 * ps);
  insert_fresh(a);
  insert_fresh(cat(sub(a, 0, 2 * ps), seq(700, 3 * ps)));
  insert_fresh(seq(5000, ps));
  const auto held = cache.match_prefix(sub(a, 0, 3 * ps));
  cache.inc_lock_ref(held.last_node);
  EXPECT_THROW(cache.reset(), Error);
  EXPECT_EQ(cache.total_size(), 8 * ps);

  cache.dec_lock_ref(held.last_node);
  cache.reset();
  EXPECT_EQ(cache.total_size(), 0);
  EXPECT_EQ(cache.evictable_size(), 0);
  EXPECT_EQ(allocator.available_size(), capacity);
  EXPECT_TRUE(cache.match_prefix(a).slots.empty());

  const Slots slots = insert_fresh(a);
  EXPECT_EQ(cache.match_prefix(a).slots, slots);
}

TEST_P(RadixCacheTest, LockCountingAndMisuse) {
  const Key a = seq(100, 2 * ps);
  insert_fresh(a);
  const auto match = cache.match_prefix(a);
  cache.inc_lock_ref(match.last_node);
  cache.inc_lock_ref(match.last_node);
  cache.dec_lock_ref(match.last_node);
  EXPECT_EQ(cache.protected_size(), 2 * ps);
  cache.dec_lock_ref(match.last_node);
  EXPECT_EQ(cache.protected_size(), 0);
  EXPECT_THROW(cache.dec_lock_ref(match.last_node), Error);
  EXPECT_EQ(cache.evictable_size(), 2 * ps);

  cache.inc_lock_ref(cache.root());
  cache.dec_lock_ref(cache.root());
  cache.dec_lock_ref(cache.root());
  EXPECT_EQ(cache.protected_size(), 0);
}

TEST_P(RadixCacheTest, RejectsBadArguments) {
  const Slots slots = take(allocator, 2 * ps);
  EXPECT_THROW(cache.insert(seq(100, 2 * ps), sub(slots, 0, ps)), Error);
  if (ps > 1) {
    EXPECT_THROW(cache.insert(seq(100, ps + 1), sub(slots, 0, ps + 1)), Error);
  }
  EXPECT_THROW({ RadixCache other(allocator, ps * 2); }, Error);
  EXPECT_EQ(cache.total_size(), 0);
  allocator.free(slots);
}

// Brute-force model of the cache: every cached page prefix (the first k whole pages of some
// cached key) with the slots of its last page. After an eviction the model cannot know which
// unlocked prefixes went, so it marks them unknown; the next match or insert along that path
// tells it, and a periodic full pass settles everything.
class Model {
 public:
  explicit Model(int page_size) : ps_(page_size) {}

  struct Page {
    Slots slots;
    bool known = true;  // certainly still cached
  };
  std::map<Key, Page> pages;

  // Forgets prefix and every page prefix that extends it. Extensions sort right after it.
  void prune(const Key& prefix) {
    auto it = pages.lower_bound(prefix);
    while (it != pages.end() && it->first.size() >= prefix.size() &&
           std::equal(prefix.begin(), prefix.end(), it->first.begin())) {
      it = pages.erase(it);
    }
  }

  // The page prefixes that no other page prefix extends: the cached keys.
  std::vector<Key> maximal() const {
    std::vector<Key> out;
    for (auto it = pages.begin(); it != pages.end(); ++it) {
      auto next = std::next(it);
      const bool extended = next != pages.end() && next->first.size() > it->first.size() &&
                            std::equal(it->first.begin(), it->first.end(), next->first.begin());
      if (!extended) out.push_back(it->first);
    }
    return out;
  }

  int64_t tokens(bool only_known) const {
    int64_t n = 0;
    for (const auto& [key, page] : pages) n += (!only_known || page.known) ? ps_ : 0;
    return n;
  }

 private:
  int ps_;
};

TEST_P(RadixCacheTest, RandomizedAgainstBruteForceModel) {
  constexpr int kOps = 2000;
  constexpr int kMaxPages = 8;
  constexpr int kAlphabet = 3;  // few token ids, so random sequences often share prefixes
  PagedTokenAllocator small(48 * ps, ps);  // small enough that inserts must evict
  const int64_t small_capacity = small.available_size();
  RadixCache rc(small, ps);
  Model model(ps);
  std::mt19937 rng(20240611u + static_cast<uint32_t>(ps));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  struct Held {
    RadixNode* node;
    Key prefix;
  };
  std::vector<Held> held;
  std::vector<Key> pool;  // earlier keys to derive shared prefixes from

  auto random_tokens = [&](int n) {
    Key t(static_cast<size_t>(n));
    for (auto& v : t) v = RadixKey{uniform(1, kAlphabet)} << 33;
    return t;
  };
  // Often an earlier key cut at any token (so divergence can fall mid-page) plus a random tail.
  auto make_key = [&](bool whole_pages) {
    Key key;
    if (!pool.empty() && uniform(0, 9) < 7) {
      const Key& base = pool[static_cast<size_t>(uniform(0, static_cast<int>(pool.size()) - 1))];
      key = cat(sub(base, 0, uniform(0, static_cast<int>(base.size()))), random_tokens(uniform(0, 3 * ps)));
    } else {
      key = random_tokens(uniform(1, 6 * ps));
    }
    key.resize(std::min(key.size(), static_cast<size_t>(kMaxPages * ps)));
    if (whole_pages) {
      key.resize(key.size() / static_cast<size_t>(ps) * static_cast<size_t>(ps));
      if (key.empty()) key = random_tokens(ps);
    }
    return key;
  };

  auto locked_prefixes = [&] {
    std::set<Key> locked;
    for (const Held& h : held) {
      for (size_t len = static_cast<size_t>(ps); len <= h.prefix.size(); len += static_cast<size_t>(ps)) {
        locked.insert(sub(h.prefix, 0, static_cast<int64_t>(len)));
      }
    }
    return locked;
  };

  // What a match tells the model: the matched pages are cached with these slots; the next page
  // of key is not (so nothing extending it is either).
  auto check_match = [&](const Key& key, const RadixCache::Match& m) {
    const size_t len = m.slots.size();
    ASSERT_EQ(len % static_cast<size_t>(ps), 0u);
    ASSERT_LE(len, key.size());
    EXPECT_EQ(m.last_node == rc.root(), len == 0);
    for (size_t end = static_cast<size_t>(ps); end <= len; end += static_cast<size_t>(ps)) {
      auto it = model.pages.find(sub(key, 0, static_cast<int64_t>(end)));
      ASSERT_NE(it, model.pages.end()) << "the cache matched a page it was never given";
      EXPECT_TRUE(std::equal(it->second.slots.begin(), it->second.slots.end(),
                             m.slots.begin() + static_cast<int64_t>(end) - ps));
      it->second.known = true;
    }
    if (len + static_cast<size_t>(ps) <= key.size()) {
      const Key next = sub(key, 0, static_cast<int64_t>(len) + ps);
      auto it = model.pages.find(next);
      if (it != model.pages.end()) {
        EXPECT_FALSE(it->second.known) << "a page that cannot have been evicted did not match";
      }
      model.prune(next);
    }
  };

  auto evict = [&](int64_t num_tokens) {
    const int64_t evictable = rc.evictable_size();
    const int64_t available = small.available_size();
    const int64_t freed = rc.evict(num_tokens);
    EXPECT_LE(freed, evictable);
    EXPECT_TRUE(freed >= num_tokens || rc.evictable_size() == 0);
    EXPECT_EQ(rc.evictable_size(), evictable - freed);
    EXPECT_EQ(small.available_size(), available + freed);
    if (freed > 0) {
      const auto locked = locked_prefixes();
      for (auto& [key, page] : model.pages) page.known = page.known && locked.contains(key);
    }
  };

  // Slots for num_tokens new tokens, evicting first if needed; nullopt when even that is short.
  auto alloc = [&](int64_t num_tokens) {
    if (small.available_size() < num_tokens) evict(num_tokens - small.available_size());
    return small.alloc(num_tokens);
  };

  auto insert = [&](const Key& key, const Slots& slots, int64_t owned_from) {
    const int64_t cached = rc.insert(key, slots);
    ASSERT_EQ(cached % ps, 0);
    ASSERT_LE(cached, static_cast<int64_t>(key.size()));
    for (int64_t end = ps; end <= cached; end += ps) {
      auto it = model.pages.find(sub(key, 0, end));
      ASSERT_NE(it, model.pages.end()) << "insert found a page it was never given";
      it->second.known = true;
    }
    if (cached < static_cast<int64_t>(key.size())) {
      const Key next = sub(key, 0, cached + ps);
      auto it = model.pages.find(next);
      if (it != model.pages.end()) {
        EXPECT_FALSE(it->second.known) << "a page that cannot have been evicted was not found";
      }
      model.prune(next);
    }
    for (int64_t end = cached + ps; end <= static_cast<int64_t>(key.size()); end += ps) {
      model.pages[sub(key, 0, end)] = {sub(slots, end - ps, end), true};
    }
    // Duplicates are the caller's to free, except the slots that came from the tree itself.
    if (cached > owned_from) small.free(sub(slots, owned_from, cached));
    if (pool.size() < 64) {
      pool.push_back(key);
    } else {
      pool[static_cast<size_t>(uniform(0, 63))] = key;
    }
  };

  auto check_sizes = [&] {
    EXPECT_EQ(rc.total_size(), rc.evictable_size() + rc.protected_size());
    EXPECT_EQ(rc.protected_size(), static_cast<int64_t>(locked_prefixes().size()) * ps);
    EXPECT_EQ(small.available_size() + rc.total_size(), small_capacity) << "slots leaked";
    EXPECT_LE(model.tokens(true), rc.total_size());
    EXPECT_GE(model.tokens(false), rc.total_size());
  };

  // Matches every cached key: afterwards the model knows exactly what is cached.
  auto full_check = [&] {
    for (const Key& key : model.maximal()) check_match(key, rc.match_prefix(key));
    EXPECT_EQ(rc.total_size(), model.tokens(false));
    EXPECT_EQ(model.tokens(true), model.tokens(false));
  };

  for (int op = 0; op < kOps && !::testing::Test::HasFailure(); ++op) {
    const int kind = uniform(0, 99);
    if (kind < 25) {  // the scheduler's way: match, lock, allocate the rest, insert
      const Key key = make_key(true);
      const auto m = rc.match_prefix(key);
      check_match(key, m);
      rc.inc_lock_ref(m.last_node);
      held.push_back({m.last_node, sub(key, 0, static_cast<int64_t>(m.slots.size()))});
      const auto fresh = alloc(static_cast<int64_t>(key.size() - m.slots.size()));
      if (fresh) {
        const int64_t matched = static_cast<int64_t>(m.slots.size());
        insert(key, cat(m.slots, *fresh), matched);
      }
      held.pop_back();
      rc.dec_lock_ref(m.last_node);
    } else if (kind < 40) {  // all-new slots: whatever is already cached comes back as duplicates
      const Key key = make_key(true);
      const auto fresh = alloc(static_cast<int64_t>(key.size()));
      if (fresh) insert(key, *fresh, 0);
    } else if (kind < 65) {
      const Key key = make_key(false);
      check_match(key, rc.match_prefix(key));
    } else if (kind < 75) {
      if (held.size() < 6) {
        const Key key = make_key(false);
        const auto m = rc.match_prefix(key);
        check_match(key, m);
        rc.inc_lock_ref(m.last_node);
        held.push_back({m.last_node, sub(key, 0, static_cast<int64_t>(m.slots.size()))});
      }
    } else if (kind < 85) {
      if (!held.empty()) {
        const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(held.size()) - 1));
        rc.dec_lock_ref(held[i].node);
        held.erase(held.begin() + static_cast<int64_t>(i));
      }
    } else {
      evict(uniform(0, 6 * ps));
    }
    check_sizes();
    if (op % 100 == 99) full_check();
  }

  for (const Held& h : held) rc.dec_lock_ref(h.node);
  held.clear();
  check_sizes();
  full_check();
  EXPECT_GT(model.pages.size(), 0u);
  rc.reset();
  EXPECT_EQ(rc.total_size(), 0);
  EXPECT_EQ(small.available_size(), small_capacity);
}

INSTANTIATE_TEST_SUITE_P(RadixCache, RadixCacheTest, ::testing::Values(1, 16),
                         [](const auto& info) { return "page_size_" + std::to_string(info.param); });

}  // namespace
}  // namespace specula
