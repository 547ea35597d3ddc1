// SPDX-License-Identifier: Apache-2.0
// A vector whose copies share their elements until one of them changes
// (copy on write). A step's layout goes into every step begun while no
// worker, variable or replica state changes; with this, that costs a
// reference count, not one allocation per variable.
//
// Elements are read through the const interface only (begin/end, [], front,
// back: const whether or not the vector is), so reading never copies. A
// change goes through Own(), which first gives this copy elements of its own
// when another copy shares them, or through push_back/reserve, which call
// it. A reference taken from Own() is valid until this vector is
// copied, assigned or changed again.
//
// One object is not safe to use from two threads at once (as std::vector);
// distinct copies are, whichever threads hold them: shared elements are
// never written.
#ifndef REPVAR_COMMON_BASE_SHARED_VECTOR_H_
#define REPVAR_COMMON_BASE_SHARED_VECTOR_H_

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace repvar {

template <typename T>
class SharedVector {
 public:
  using value_type = T;
  using size_type = size_t;
  using const_iterator = typename std::vector<T>::const_iterator;
  using iterator = const_iterator;

  SharedVector() = default;
  SharedVector(std::vector<T> items)  // NOLINT: converts, as a vector is assigned
      : items_(std::make_shared<std::vector<T>>(std::move(items))) {}
  SharedVector(std::initializer_list<T> items) : SharedVector(std::vector<T>(items)) {}

  // ---- Reads: never copy. ----
  size_t size() const { return items_ ? items_->size() : 0; }
  bool empty() const { return size() == 0; }
  const std::vector<T>& view() const { return items_ ? *items_ : Empty(); }
  const T& operator[](size_t i) const { return (*items_)[i]; }
  const_iterator begin() const { return view().begin(); }
  const_iterator end() const { return view().end(); }
  const T& front() const { return items_->front(); }
  const T& back() const { return items_->back(); }
  // Names the elements: copies that share them give the same (null when
  // empty and never owned).
  const void* identity() const { return items_.get(); }
  // Whether `other` shares these elements (a copy neither has changed since).
  bool SharesWith(const SharedVector& other) const {
    return items_ != nullptr && items_ == other.items_;
  }

  // ---- Changes: on elements of this copy's own. ----
  std::vector<T>& Own() {
    if (items_ == nullptr) {
      items_ = std::make_shared<std::vector<T>>();
    } else if (items_.use_count() > 1) {
      items_ = std::make_shared<std::vector<T>>(*items_);
    }
    return *items_;
  }
  void push_back(T item) { Own().push_back(std::move(item)); }
  void reserve(size_t n) { Own().reserve(n); }
  // Drops this copy's hold on the elements; other copies keep them.
  void clear() { items_.reset(); }

  friend bool operator==(const SharedVector& a, const SharedVector& b) {
    return a.SharesWith(b) || a.view() == b.view();
  }

 private:
  static const std::vector<T>& Empty() {
    static const std::vector<T>* const kEmpty = new std::vector<T>();
    return *kEmpty;
  }

  std::shared_ptr<std::vector<T>> items_;
};

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_SHARED_VECTOR_H_
