//! The file types `tidal quantize` writes: llama.cpp's `llama_ftype`s of the same names.

use candle_core::quantized::GgmlDType;

/// A quantisation mix, as `llama-quantize` names it.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4_K_S,
    Q4_K_M,
    Q5_K_M,
    Q6_K,
}

impl FileType {
    /// Every file type, in the order the error message lists them.
    pub const ALL: [FileType; 7] = [
        FileType::Q4_K_M,
        FileType::Q4_K_S,
        FileType::Q5_K_M,
        FileType::Q6_K,
        FileType::Q8_0,
        FileType::Q4_0,
        FileType::Q4_1,
    ];

    /// The lower-case name (`q4_k_m`).
    pub fn name(self) -> &'static str {
        match self {
            FileType::Q4_0 => "q4_0",
            FileType::Q4_1 => "q4_1",
            FileType::Q8_0 => "q8_0",
            FileType::Q4_K_S => "q4_k_s",
            FileType::Q4_K_M => "q4_k_m",
            FileType::Q5_K_M => "q5_k_m",
            FileType::Q6_K => "q6_k",
        }
    }

    /// llama.cpp's number for it (`enum llama_ftype`), stored as `general.file_type`.
    pub fn id(self) -> u32 {
        match self {
            FileType::Q4_0 => 2,
            FileType::Q4_1 => 3,
            FileType::Q8_0 => 7,
            FileType::Q4_K_S => 14,
            FileType::Q4_K_M => 15,
            FileType::Q5_K_M => 17,
            FileType::Q6_K => 18,
        }
    }

    /// The type of every matrix no rule singles out (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlDType {
        match self {
            FileType::Q4_0 => GgmlDType::Q4_0,
            FileType::Q4_1 => GgmlDType::Q4_1,
            FileType::Q8_0 => GgmlDType::Q8_0,
            FileType::Q4_K_S | FileType::Q4_K_M => GgmlDType::Q4K,
            FileType::Q5_K_M => GgmlDType::Q5K,
            FileType::Q6_K => GgmlDType::Q6K,
        }
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FileType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        FileType::ALL
            .into_iter()
            .find(|t| t.name() == lower)
            .ok_or_else(|| {
                let known: Vec<&str> = FileType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown quantisation type `{s}` (expected one of {})",
                    known.join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_ids_are_llamas() {
        for t in FileType::ALL {
            assert_eq!(t.name().parse::<FileType>(), Ok(t));
            assert_eq!(t.name().to_uppercase().parse::<FileType>(), Ok(t));
        }
        assert_eq!(FileType::Q4_K_M.id(), 15);
        assert_eq!(FileType::Q6_K.id(), 18);
        let err = "q3_k_xl".parse::<FileType>().unwrap_err();
        assert!(err.contains("q3_k_xl") && err.contains("q4_k_m"), "{err}");
    }
}
