// Progress lines on stderr.
#include "progress_line.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

namespace sextant::cli {

namespace {

// 1234 -> "1234", 123456 -> "123k", 12345678 -> "12.3M".
std::string count_text(double n) {
  if (n >= 1e7) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e5) return fmt::format("{:.0f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string rate_text(double per_s) {
  if (per_s >= 1e4) return count_text(per_s);
  if (per_s >= 10) return fmt::format("{:.0f}", per_s);
  return fmt::format("{:.1f}", per_s);
}

std::string duration_text(double s) {
  if (s >= 3600)
    return fmt::format("{:.0f} h {:02.0f} min", std::floor(s / 3600), std::fmod(s, 3600) / 60);
  if (s >= 60) return fmt::format("{:.0f} min {:02.0f} s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f} s", s);
}

constexpr auto kFirstDraw = std::chrono::seconds(1);
constexpr auto kRedraw = std::chrono::milliseconds(100);

}  // namespace

std::string progress_text(std::string_view what, std::string_view unit, int64_t done, int64_t total,
                          double elapsed_s) {
  const double d = static_cast<double>(done);
  const double t = static_cast<double>(total);
  std::string text = fmt::format("{}: {}/{} {} ({:.0f}%)", what, count_text(d), count_text(t), unit,
                                 t > 0 ? 100.0 * d / t : 0.0);
  if (elapsed_s > 0 && done > 0) {
    const double rate = d / elapsed_s;
    text += fmt::format(", {} {}/s", rate_text(rate), unit);
    if (done < total) text += fmt::format(", {} left", duration_text((t - d) / rate));
  }
  return text;
}

ProgressLine::ProgressLine(std::string what, std::string unit, bool enabled)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      enabled_(enabled && isatty(STDERR_FILENO) != 0) {}

void ProgressLine::finish() {
  if (drawn_) fmt::print(stderr, "\r{:{}}\r", "", width_);
  drawn_ = false;
  enabled_ = false;
}

void ProgressLine::update(int64_t done, int64_t total) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  if (done >= total) {
    // One series is over (`scale` runs one per GPU count): clear, and time the next from here.
    if (drawn_) fmt::print(stderr, "\r{:{}}\r", "", width_);
    drawn_ = false;
    start_ = now;
    return;
  }
  if (now - start_ < kFirstDraw || (drawn_ && now - last_draw_ < kRedraw)) return;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::string text = "  " + progress_text(what_, unit_, done, total, elapsed);
  const size_t shown = text.size();
  if (shown < width_) text.append(width_ - shown, ' ');  // cover a longer previous line
  fmt::print(stderr, "\r{}", text);
  std::fflush(stderr);
  width_ = std::max(width_, shown);
  drawn_ = true;
  last_draw_ = now;
}

}  // namespace sextant::cli
