//! How many workers a set of models needs by memory alone: first-fit decreasing (Johnson's
//! bin packing heuristic, within 11/9 of the optimum plus one bin), with the rule that a
//! worker holds at most one copy of a model. The placement raises the worker count to it.

/// Copies of one model to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copies<'a> {
    /// The model id (ties in size are broken by it).
    pub model: &'a str,
    /// Bytes one copy takes.
    pub memory_bytes: u64,
    /// How many workers must hold it.
    pub copies: u32,
}

/// Fresh workers of `worker_memory_bytes` that first-fit decreasing needs to hold `items`.
/// Items larger than a worker are left out (the placement reports them).
pub fn workers_needed(items: &[Copies<'_>], worker_memory_bytes: u64) -> u32 {
    let mut order: Vec<&Copies<'_>> = items
        .iter()
        .filter(|c| c.copies > 0 && c.memory_bytes <= worker_memory_bytes)
        .collect();
    order.sort_by(|a, b| {
        b.memory_bytes
            .cmp(&a.memory_bytes)
            .then_with(|| a.model.cmp(b.model))
    });
    // free bytes of each bin, and the models it holds
    let mut bins: Vec<(u64, Vec<&str>)> = Vec::new();
    for item in order {
        for _ in 0..item.copies {
            let fit = bins
                .iter_mut()
                .find(|(free, held)| *free >= item.memory_bytes && !held.contains(&item.model));
            match fit {
                Some((free, held)) => {
                    *free -= item.memory_bytes;
                    held.push(item.model);
                }
                None => bins.push((worker_memory_bytes - item.memory_bytes, vec![item.model])),
            }
        }
    }
    u32::try_from(bins.len()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(model: &str, memory_bytes: u64, copies: u32) -> Copies<'_> {
        Copies {
            model,
            memory_bytes,
            copies,
        }
    }

    #[test]
    fn packs_by_memory_one_copy_per_worker() {
        let cases: &[(&[Copies<'_>], u32)] = &[
            (&[], 0),
            (&[c("a", 10, 0)], 0),
            (&[c("a", 10, 1)], 1),
            // four quarters fill one worker
            (
                &[c("a", 25, 1), c("b", 25, 1), c("c", 25, 1), c("d", 25, 1)],
                1,
            ),
            // a fifth needs a second
            (
                &[
                    c("a", 25, 1),
                    c("b", 25, 1),
                    c("c", 25, 1),
                    c("d", 25, 1),
                    c("e", 1, 1),
                ],
                2,
            ),
            // three copies of one small model still need three workers
            (&[c("a", 1, 3)], 3),
            // decreasing order: 60 + 40 and 60 + 40, not 60, 40 + 40, 60
            (&[c("a", 40, 2), c("b", 60, 2)], 2),
            // too large for any worker: left out
            (&[c("huge", 101, 1), c("a", 100, 1)], 1),
        ];
        for (items, want) in cases {
            assert_eq!(workers_needed(items, 100), *want, "{items:?}");
        }
    }
}
