//! Stop strings over streamed text, with OpenAI semantics: generation ends at the first
//! occurrence of any stop string and the stop string itself is not returned.
//!
//! Text that could still turn out to be the start of a stop string is held back until the next
//! chunk decides it, so a client never sees part of a stop string.

/// The result of feeding one chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is safe to send now.
    pub text: String,
    /// A stop string matched: `text` ends right before it and the generation must end.
    pub stopped: bool,
}

/// Matches stop strings across chunk boundaries.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored: they would match at once).
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds a chunk of generated text.
    pub fn push(&mut self, chunk: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(chunk);
        // Earliest match wins: what precedes it is exactly what the client may see.
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let mut text = std::mem::take(&mut self.held);
            text.truncate(pos);
            self.stopped = true;
            return StopOutput {
                text,
                stopped: true,
            };
        }
        let keep = self.longest_partial_suffix();
        let split = self.held.len() - keep;
        let rest = self.held.split_off(split);
        let text = std::mem::replace(&mut self.held, rest);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// Ends the stream (no more text will come): releases what was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn longest_partial_suffix(&self) -> usize {
        let h = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for len in (best + 1..=max).rev() {
                let start = h.len() - len;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for c in chunks {
            let o = m.push(c);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_inside_one_chunk_cuts_before_it() {
        assert_eq!(feed(&["\n\n"], &["Hello\n\nworld"]), ("Hello".into(), true));
    }

    #[test]
    fn stop_split_across_chunks() {
        assert_eq!(
            feed(&["STOP"], &["abc S", "T", "OP tail"]),
            ("abc ".into(), true)
        );
    }

    #[test]
    fn partial_prefix_is_held_then_released() {
        let mut m = StopMatcher::new(["END"]);
        assert_eq!(m.push("foo EN").text, "foo ");
        let o = m.push("Dless");
        // "ENDless" contains END: stop with the text before it.
        assert_eq!(
            o,
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        let mut m = StopMatcher::new(["END"]);
        assert_eq!(m.push("foo EN").text, "foo ");
        assert_eq!(m.push("X").text, "ENX");
        assert!(!m.is_stopped());
    }

    #[test]
    fn overlapping_self_prefix() {
        // "aab" after "aa" + "ab": the match starts inside the held text.
        assert_eq!(feed(&["aab"], &["xa", "a", "ab"]), ("xa".into(), true));
        assert_eq!(feed(&["abab"], &["ab", "ab", "ab"]), (String::new(), true));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            feed(&["world", "lo w"], &["hello world"]),
            ("hel".into(), true)
        );
        assert_eq!(feed(&["bc", "abcd"], &["xab", "cd"]), ("x".into(), true));
    }

    #[test]
    fn no_stop_passes_everything_through() {
        assert_eq!(
            feed(&["zzz"], &["ab", "cz", "z", "y"]),
            ("abczzy".into(), false)
        );
        assert_eq!(feed(&[], &["ab"]), ("ab".into(), false));
        assert_eq!(feed(&[""], &["ab"]), ("ab".into(), false));
    }

    #[test]
    fn multibyte_text_never_split_inside_a_char() {
        assert_eq!(feed(&["🦙!"], &["é🦙", "🦙", "!x"]), ("é🦙".into(), true));
        let mut m = StopMatcher::new(["日本語"]);
        assert_eq!(m.push("中日本").text, "中");
        assert_eq!(m.finish(), "日本");
    }

    #[test]
    fn after_stop_nothing_more_comes_out() {
        let mut m = StopMatcher::new(["x"]);
        assert!(m.push("ax").stopped);
        assert_eq!(
            m.push("more"),
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
    }
}
