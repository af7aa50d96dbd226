//! How much memory the device has for a model: the host's available memory (within this
//! process's cgroup limit) for the CPU, the driver's free figure for a GPU.

use super::plan::Available;
use crate::engine::Device;

/// Why the available memory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AvailableError {
    /// `/proc/meminfo` could not be read or has no `MemAvailable`.
    #[error("reading the host's available memory from /proc/meminfo: {0}")]
    Meminfo(String),
    /// The GPU could not be asked.
    #[error("asking {device} for its free memory: {message}")]
    Gpu {
        /// The device.
        device: Device,
        /// What went wrong.
        message: String,
    },
}

/// The memory `device` has for a model now.
pub fn available(device: Device) -> Result<Available, AvailableError> {
    match device {
        Device::Cpu => host_available(),
        Device::Cuda(ordinal) => gpu_available(ordinal),
    }
}

fn host_available() -> Result<Available, AvailableError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| AvailableError::Meminfo(e.to_string()))?;
    let host = parse_mem_available(&meminfo)
        .ok_or_else(|| AvailableError::Meminfo("no MemAvailable line".into()))?;
    let read = |name: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok();
    let cgroup = match (read("memory.max"), read("memory.current")) {
        (Some(max), Some(current)) => cgroup_headroom(&max, &current),
        _ => None,
    };
    Ok(match cgroup {
        Some(headroom) if headroom < host => Available {
            bytes: headroom,
            source: "this cgroup's memory.max less memory.current".into(),
        },
        _ => Available {
            bytes: host,
            source: "the host's MemAvailable".into(),
        },
    })
}

#[cfg(feature = "cuda")]
fn gpu_available(ordinal: usize) -> Result<Available, AvailableError> {
    let (name, free, total) =
        tidal_kernels::cuda::device_memory(ordinal).map_err(|e| AvailableError::Gpu {
            device: Device::Cuda(ordinal),
            message: e.to_string(),
        })?;
    Ok(Available {
        bytes: free,
        source: format!("{name}: free of {}", super::plan::gib(total)),
    })
}

#[cfg(not(feature = "cuda"))]
fn gpu_available(ordinal: usize) -> Result<Available, AvailableError> {
    Err(AvailableError::Gpu {
        device: Device::Cuda(ordinal),
        message: "this build of tidal has no CUDA support; give the GPU's memory with \
                  --device-memory (e.g. 22GiB for an NVIDIA L4) to plan for it"
            .into(),
    })
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes a cgroup v2 may still take (`memory.max` less `memory.current`); `None` without a
/// limit (`max`) or on unreadable values.
fn cgroup_headroom(max: &str, current: &str) -> Option<usize> {
    let max: usize = max.trim().parse().ok()?;
    let current: usize = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available() {
        let meminfo = "MemTotal:       16318732 kB\nMemFree:         1000000 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(12_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn cgroup_limits() {
        assert_eq!(cgroup_headroom("max\n", "100\n"), None);
        assert_eq!(cgroup_headroom("1000\n", "300\n"), Some(700));
        assert_eq!(cgroup_headroom("1000", "3000"), Some(0));
    }

    #[test]
    fn the_host_answers() {
        let a = available(Device::Cpu).unwrap();
        assert!(a.bytes > 0, "{a:?}");
    }
}
