// RadixCache implementation: a compressed trie whose edges are runs of whole pages. A node's key
// holds the tokens of its edge and its value their KV slots; children are found by the first
// page of their key, which is unique among siblings because an edge ends where sequences diverge.
#include "specula/kv/radix_cache.h"

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <utility>

#include "specula/core/error.h"

namespace specula {

struct RadixNode {
  // Orders pages lexicographically; transparent so lookups pass a span of the caller's key
  // instead of copying it into a vector.
  struct PageLess {
    using is_transparent = void;
    bool operator()(std::span<const RadixKey> a, std::span<const RadixKey> b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
    }
  };

  std::vector<RadixKey> key;   // a whole number of pages; empty only for the root
  std::vector<int32_t> value;  // KV slot of each token of key
  RadixNode* parent = nullptr;
  std::map<std::vector<RadixKey>, std::unique_ptr<RadixNode>, PageLess> children;  // by first page
  int lock_ref = 0;
  uint64_t last_access = 0;
};

namespace {

int64_t size_of(const RadixNode* node) { return static_cast<int64_t>(node->key.size()); }

// Length of the common prefix of a and b in whole pages: a page matches only if all its tokens
// do, since a partially shared page cannot be shared (the allocator frees whole pages).
size_t page_match_len(std::span<const RadixKey> a, std::span<const RadixKey> b, size_t page_size) {
  const size_t end = std::min(a.size(), b.size()) / page_size * page_size;
  size_t len = 0;
  while (len < end && std::equal(a.begin() + len, a.begin() + len + page_size, b.begin() + len)) {
    len += page_size;
  }
  return len;
}

template <typename F>
void for_each_node(RadixNode* root, F&& f) {
  std::vector<RadixNode*> stack{root};
  while (!stack.empty()) {
    RadixNode* node = stack.back();
    stack.pop_back();
    f(node);
    for (auto& [page, child] : node->children) stack.push_back(child.get());
  }
}

}  // namespace

RadixCache::RadixCache(PagedTokenAllocator& allocator, int page_size)
    : allocator_(allocator), page_size_(page_size), root_(std::make_unique<RadixNode>()) {
  SPECULA_CHECK(page_size == allocator.page_size(),
                "RadixCache page_size {} differs from the allocator's page_size {}", page_size,
                allocator.page_size());
}

RadixCache::~RadixCache() = default;

void RadixCache::touch(RadixNode* node) { node->last_access = ++clock_; }

// Splits node after prefix_len tokens (whole pages, fewer than its key). A new node takes the
// prefix and node keeps the suffix, so a handle a caller holds to node still ends at the same
// token. Every user of node also uses the prefix, so the new node inherits lock_ref and the
// evictable/protected sizes stay as they were.
RadixNode* RadixCache::split(RadixNode* node, size_t prefix_len) {
  SPECULA_ASSERT(prefix_len > 0 && prefix_len < node->key.size() && prefix_len % page_size_ == 0,
                 "split of a {}-token node at {}", node->key.size(), prefix_len);
  RadixNode* parent = node->parent;
  auto slot = parent->children.find(std::span<const RadixKey>(node->key).first(page_size_));
  SPECULA_ASSERT(slot != parent->children.end());

  auto prefix = std::make_unique<RadixNode>();
  const auto cut = static_cast<std::ptrdiff_t>(prefix_len);
  prefix->key.assign(node->key.begin(), node->key.begin() + cut);
  prefix->value.assign(node->value.begin(), node->value.begin() + cut);
  prefix->parent = parent;
  prefix->lock_ref = node->lock_ref;
  prefix->last_access = node->last_access;
  node->key.erase(node->key.begin(), node->key.begin() + cut);
  node->value.erase(node->value.begin(), node->value.begin() + cut);
  node->parent = prefix.get();

  std::vector<RadixKey> suffix_page(node->key.begin(), node->key.begin() + page_size_);
  prefix->children.emplace(std::move(suffix_page), std::move(slot->second));
  slot->second = std::move(prefix);  // same first page as before, so the map key stays valid
  return slot->second.get();
}

RadixCache::Match RadixCache::match_prefix(std::span<const RadixKey> key) {
  const auto ps = static_cast<size_t>(page_size_);
  key = key.first(key.size() / ps * ps);
  Match match{{}, root_.get()};
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = match.last_node->children.find(key.subspan(pos, ps));
    if (it == match.last_node->children.end()) break;
    RadixNode* child = it->second.get();
    const size_t len = page_match_len(child->key, key.subspan(pos), ps);
    if (len < child->key.size()) child = split(child, len);
    touch(child);
    match.slots.insert(match.slots.end(), child->value.begin(), child->value.end());
    match.last_node = child;
    pos += len;
  }
  return match;
}

int64_t RadixCache::insert(std::span<const RadixKey> key, std::span<const int32_t> slots) {
  const auto ps = static_cast<size_t>(page_size_);
  SPECULA_CHECK(key.size() == slots.size(), "insert of {} tokens with {} slots", key.size(),
                slots.size());
  SPECULA_CHECK(key.size() % ps == 0, "insert of {} tokens is not a whole number of {}-token pages",
                key.size(), ps);
  RadixNode* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = node->children.find(key.subspan(pos, ps));
    if (it == node->children.end()) break;
    RadixNode* child = it->second.get();
    const size_t len = page_match_len(child->key, key.subspan(pos), ps);
    if (len < child->key.size()) child = split(child, len);
    touch(child);
    node = child;
    pos += len;
  }
  if (pos < key.size()) {
    auto leaf = std::make_unique<RadixNode>();
    leaf->key.assign(key.begin() + static_cast<std::ptrdiff_t>(pos), key.end());
    leaf->value.assign(slots.begin() + static_cast<std::ptrdiff_t>(pos), slots.end());
    leaf->parent = node;
    touch(leaf.get());
    evictable_size_ += size_of(leaf.get());
    std::vector<RadixKey> first_page(leaf->key.begin(), leaf->key.begin() + page_size_);
    node->children.emplace(std::move(first_page), std::move(leaf));
  }
  return static_cast<int64_t>(pos);
}

void RadixCache::inc_lock_ref(RadixNode* node) {
  SPECULA_CHECK(node != nullptr, "inc_lock_ref of a null node");
  for (; node != root_.get(); node = node->parent) {
    if (node->lock_ref++ == 0) {
      evictable_size_ -= size_of(node);
      protected_size_ += size_of(node);
    }
  }
}

void RadixCache::dec_lock_ref(RadixNode* node) {
  SPECULA_CHECK(node != nullptr, "dec_lock_ref of a null node");
  // An ancestor's lock_ref is at least its descendant's, so only the first node can fail this
  // check, before anything has changed.
  for (; node != root_.get(); node = node->parent) {
    SPECULA_CHECK(node->lock_ref > 0, "dec_lock_ref of a node that is not locked");
    if (--node->lock_ref == 0) {
      protected_size_ -= size_of(node);
      evictable_size_ += size_of(node);
    }
  }
}

int64_t RadixCache::evict(int64_t num_tokens) {
  // Min-heap on last access. Ticks are unique among nodes that can be in the heap together (a
  // split copies a tick only onto an ancestor), so the order never depends on addresses.
  using Candidate = std::pair<uint64_t, RadixNode*>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> leaves;
  for_each_node(root_.get(), [&](RadixNode* node) {
    if (node != root_.get() && node->children.empty() && node->lock_ref == 0) {
      leaves.emplace(node->last_access, node);
    }
  });

  int64_t freed = 0;
  while (freed < num_tokens && !leaves.empty()) {
    RadixNode* leaf = leaves.top().second;
    leaves.pop();
    allocator_.free(leaf->value);
    freed += size_of(leaf);
    evictable_size_ -= size_of(leaf);
    RadixNode* parent = leaf->parent;
    parent->children.erase(
        parent->children.find(std::span<const RadixKey>(leaf->key).first(page_size_)));
    if (parent != root_.get() && parent->children.empty() && parent->lock_ref == 0) {
      leaves.emplace(parent->last_access, parent);
    }
  }
  return freed;
}

void RadixCache::reset() {
  SPECULA_CHECK(protected_size_ == 0, "reset of a radix cache with {} locked tokens",
                protected_size_);
  std::vector<int32_t> slots;
  for_each_node(root_.get(), [&](RadixNode* node) {
    slots.insert(slots.end(), node->value.begin(), node->value.end());
  });
  allocator_.free(slots);
  root_->children.clear();
  evictable_size_ = 0;
}

}  // namespace specula
