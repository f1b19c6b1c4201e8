// Free space on a filesystem, as the space checks before a long write read it (the checkpointer's
// before training, the hub's before a download, the safetensors writer's when a reservation fails).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ktune {

// Bytes an unprivileged writer may still use (statvfs: f_bavail blocks of f_frsize) on the
// filesystem that holds `path`, or its nearest existing ancestor; none when the filesystem does not say.
std::optional<uint64_t> free_bytes_at(const std::string& path);

}  // namespace ktune
