#ifndef PATHWAYS_COORDINATION_FRAME_QUEUE_H_
#define PATHWAYS_COORDINATION_FRAME_QUEUE_H_

// Messages waiting for a stream, batched into frames (a ClientFrame of
// requests, a HostFrame of replies): everything queued while a frame is on
// the wire leaves in the next one, so a burst costs one write. A frame is a
// protobuf message, which must stay under 2 GiB: a frame takes messages
// until they reach kMaxFrameBytes, then the next frame starts. (A message of
// more than that goes alone; large data comes in chunks well below it.)
//
// Not thread-safe: the stream's owner locks around it.

#include <cstdint>
#include <deque>
#include <utility>

namespace pw {

template <typename Frame, typename Message, Message* (Frame::*kAdd)()>
class FrameQueue {
 public:
  static constexpr int64_t kMaxFrameBytes = int64_t{64} << 20;

  void Push(Message message) {
    const int64_t bytes = static_cast<int64_t>(message.ByteSizeLong());
    if (frames_.empty() || (back_messages_ > 0 && back_bytes_ + bytes > kMaxFrameBytes)) {
      frames_.emplace_back();
      back_bytes_ = 0;
      back_messages_ = 0;
    }
    *(frames_.back().*kAdd)() = std::move(message);
    back_bytes_ += bytes;
    ++back_messages_;
  }
  bool empty() const { return frames_.empty(); }
  // Moves the oldest frame into `out` (replacing what it held); false if
  // none is queued.
  bool Pop(Frame* out) {
    if (frames_.empty()) return false;
    out->Clear();
    out->Swap(&frames_.front());
    frames_.pop_front();
    if (frames_.empty()) back_bytes_ = back_messages_ = 0;
    return true;
  }
  void Clear() {
    frames_.clear();
    back_bytes_ = back_messages_ = 0;
  }

 private:
  std::deque<Frame> frames_;
  int64_t back_bytes_ = 0;  // of the last frame
  int64_t back_messages_ = 0;
};

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_FRAME_QUEUE_H_
