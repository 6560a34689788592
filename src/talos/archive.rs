//! The `.tar.gz` that `MachineService/Kubeconfig` streams: one regular file named
//! `kubeconfig`. Talos writes the tar header and the file but never closes the tar writer
//! (siderolabs/talos, internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go,
//! `Kubeconfig`, v1.12–v1.14), so the archive may end without the padding of the last block
//! and without the two zero blocks that end a tar archive: the reader here accepts that.

use std::io::Read;

/// The largest kubeconfig accepted (an admin kubeconfig is a few KiB).
pub const MAX_KUBECONFIG: usize = 1 << 20;

const BLOCK: usize = 512;

/// The text of the file named `kubeconfig` in a gzip-compressed tar archive.
pub fn kubeconfig_from_tar_gz(archive: &[u8]) -> Result<String, String> {
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(archive)
        .take((MAX_KUBECONFIG + 64 * BLOCK) as u64)
        .read_to_end(&mut tar)
        .map_err(|e| format!("not a gzip stream: {e}"))?;
    let mut at = 0;
    while at + BLOCK <= tar.len() {
        let header = &tar[at..at + BLOCK];
        if header.iter().all(|b| *b == 0) {
            break;
        }
        let name = field_text(&header[0..100]);
        let size = octal(&header[124..136])
            .ok_or_else(|| format!("tar entry `{name}`: unreadable size"))?;
        let kind = header[156];
        let start = at + BLOCK;
        let end = start
            .checked_add(size)
            .filter(|e| *e <= tar.len())
            .ok_or_else(|| format!("tar entry `{name}`: truncated ({size} bytes announced)"))?;
        if name.trim_start_matches("./") == "kubeconfig" && (kind == b'0' || kind == 0) {
            if size > MAX_KUBECONFIG {
                return Err(format!("kubeconfig of {size} bytes is larger than 1 MiB"));
            }
            return String::from_utf8(tar[start..end].to_vec())
                .map_err(|_| "the kubeconfig is not UTF-8".to_string());
        }
        at = start + size.div_ceil(BLOCK) * BLOCK;
    }
    Err("the archive holds no file named `kubeconfig`".into())
}

fn field_text(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn octal(field: &[u8]) -> Option<usize> {
    let text = field_text(field);
    let text = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if text.is_empty() {
        return Some(0);
    }
    usize::from_str_radix(text, 8).ok()
}

/// A `.tar.gz` holding one regular file, written as Talos writes it: header and data,
/// no padding of the last block, no end-of-archive blocks. For the twin and tests.
pub fn tar_gz_one_file(name: &str, mode: u32, mtime: u64, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut header = [0u8; BLOCK];
    let n = name.len().min(100);
    header[..n].copy_from_slice(&name.as_bytes()[..n]);
    let put = |h: &mut [u8; BLOCK], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    put(&mut header, 100, 8, u64::from(mode));
    put(&mut header, 108, 8, 0);
    put(&mut header, 116, 8, 0);
    put(&mut header, 124, 12, data.len() as u64);
    put(&mut header, 136, 12, mtime);
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u64 = header.iter().map(|b| u64::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(s.as_bytes());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&header);
    let _ = gz.write_all(data);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_archive_talos_writes_without_its_trailer() {
        let text = "apiVersion: v1\nkind: Config\n";
        let archive = tar_gz_one_file("kubeconfig", 0o600, 1_700_000_000, text.as_bytes());
        assert_eq!(kubeconfig_from_tar_gz(&archive).unwrap(), text);
    }

    #[test]
    fn refuses_what_is_not_a_kubeconfig_archive() {
        assert!(kubeconfig_from_tar_gz(b"plain")
            .unwrap_err()
            .contains("not a gzip stream"));
        let other = tar_gz_one_file("talosconfig", 0o600, 0, b"x");
        assert!(kubeconfig_from_tar_gz(&other)
            .unwrap_err()
            .contains("no file named `kubeconfig`"));
        // A header announcing more than was sent.
        let mut archive = tar_gz_one_file("kubeconfig", 0o600, 0, b"abc");
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(archive.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        tar.truncate(BLOCK + 1);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        archive = gz.finish().unwrap();
        assert!(kubeconfig_from_tar_gz(&archive)
            .unwrap_err()
            .contains("truncated"));
    }
}
