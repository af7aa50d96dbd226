//! The scheduler's side of speculative decoding: proposals scheduled after the decode
//! token under the step's budget, verified tokens appended, rejected positions rolled back.

use super::{Scheduler, SchedulerConfig, SeqId};

fn scheduler(budget: usize, block_size: usize, num_blocks: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 4,
        block_size,
        num_blocks,
        enable_prefix_caching: true,
    })
}

/// Prefills `prompt` for `id` and appends `first` as its first token.
fn prefilled(s: &mut Scheduler, id: SeqId, prompt: &[u32], max_new: usize, first: u32) {
    s.add(id, prompt.to_vec(), max_new).unwrap();
    let batch = s.schedule();
    assert!(batch.seqs.iter().any(|q| q.id == id && q.sample));
    s.append_sampled(&[(id, first)]);
    s.check_invariants().unwrap();
    assert!(s.is_decoding(id));
}

#[test]
fn proposals_run_after_the_decode_token_and_accepted_ones_are_kept() {
    let mut s = scheduler(64, 4, 16);
    prefilled(&mut s, 1, &[1, 2, 3, 4, 5, 6], 20, 50);
    assert_eq!(s.propose(1, vec![60, 61, 62]), 3);
    let batch = s.schedule();
    s.check_invariants().unwrap();
    let q = &batch.seqs[0];
    assert_eq!(q.tokens, vec![50, 60, 61, 62]);
    assert_eq!((q.start_pos, q.num_spec, q.sample), (6, 3, true));
    assert_eq!(batch.num_tokens, 4);
    assert_eq!(q.block_table.len(), 3, "positions 0..10 in blocks of 4");
    // 60 and 61 accepted, then the target's own 70.
    s.append_tokens(&[(1, vec![60, 61, 70])]);
    s.check_invariants().unwrap();
    assert_eq!(s.generated_tokens(1).unwrap(), &[50, 60, 61, 70]);
    assert!(s.is_decoding(1));
    // The next step feeds 70 at position 9: KV up to the last accepted proposal is kept.
    let batch = s.schedule();
    assert_eq!(
        (batch.seqs[0].start_pos, &batch.seqs[0].tokens[..]),
        (9, &[70][..])
    );
}

#[test]
fn rejected_positions_give_their_blocks_back() {
    let mut s = scheduler(64, 4, 8);
    prefilled(&mut s, 1, &[1, 2, 3, 4], 20, 50);
    let free_before = s.kv_cache().num_free_blocks();
    s.propose(1, vec![60, 61, 62, 63, 64, 65, 66]);
    let batch = s.schedule();
    assert_eq!(batch.seqs[0].block_table.len(), 3, "positions 0..12");
    assert_eq!(s.kv_cache().num_free_blocks(), free_before - 2);
    // Everything rejected: the target's own token only.
    s.append_tokens(&[(1, vec![99])]);
    s.check_invariants().unwrap();
    assert_eq!(s.generated_tokens(1).unwrap(), &[50, 99]);
    assert_eq!(
        s.kv_cache().block_table(1).unwrap().len(),
        2,
        "5 computed positions need 2 blocks"
    );
    assert_eq!(s.kv_cache().num_free_blocks(), free_before - 1);
}

#[test]
fn the_prefix_cache_never_holds_a_rejected_token() {
    let mut s = scheduler(64, 4, 16);
    prefilled(&mut s, 1, &[1, 2, 3], 20, 4);
    // Positions 3..8 run 4, 60, 61, 62, 63: block 1 is full of proposals.
    s.propose(1, vec![60, 61, 62, 63]);
    s.schedule();
    s.append_tokens(&[(1, vec![5])]);
    s.check_invariants().unwrap();
    s.finish(1);
    // Only block 0 (1, 2, 3, 4) is cached: a prompt holding the rejected tokens hits 4.
    assert_eq!(s.kv_cache().pool().num_cached(), 1);
    s.add(2, vec![1, 2, 3, 4, 60, 61, 62, 63, 9], 1).unwrap();
    let batch = s.schedule();
    assert_eq!(batch.seqs[0].start_pos, 4);
    s.append_sampled(&[(2, 0)]);
    s.finish(2);

    // Accepted proposals that fill a block are cached at once.
    let mut s = scheduler(64, 4, 16);
    prefilled(&mut s, 1, &[1, 2, 3], 20, 4);
    s.propose(1, vec![60, 61, 62, 63]);
    s.schedule();
    s.append_tokens(&[(1, vec![60, 61, 62, 63, 64])]);
    s.check_invariants().unwrap();
    assert_eq!(s.kv_cache().pool().num_cached(), 2);
    s.add(2, vec![1, 2, 3, 4, 60, 61, 62, 63, 9], 1).unwrap();
    let batch = s.schedule();
    let q = batch.seqs.iter().find(|q| q.id == 2).unwrap();
    assert_eq!(q.start_pos, 8);
}

#[test]
fn the_budget_and_the_length_limit_cut_proposals() {
    let mut s = scheduler(3, 4, 16);
    prefilled(&mut s, 1, &[1, 2], 20, 50);
    s.propose(1, vec![60, 61, 62, 63]);
    let batch = s.schedule();
    assert_eq!((batch.num_tokens, batch.seqs[0].num_spec), (3, 2));
    assert_eq!(batch.seqs[0].tokens, vec![50, 60, 61]);
    s.append_tokens(&[(1, vec![60, 61, 70])]);
    s.check_invariants().unwrap();

    // max_new 4 with 1 generated: at most 2 proposals (a step adds one more of its own).
    let mut s = scheduler(64, 4, 16);
    prefilled(&mut s, 1, &[1, 2], 4, 50);
    assert_eq!(s.propose(1, vec![60, 61, 62, 63]), 2);
    s.schedule();
    // More tokens than asked for are cut; the sequence ends at its limit.
    s.append_tokens(&[(1, vec![60, 61, 62, 63])]);
    s.check_invariants().unwrap();
    assert_eq!(s.generated_tokens(1).unwrap(), &[50, 60, 61, 62]);
    assert_eq!(s.num_running(), 0);
}

#[test]
fn only_decoding_sequences_take_proposals() {
    let mut s = scheduler(4, 4, 16);
    s.add(1, vec![1, 2, 3, 4, 5, 6, 7, 8], 10).unwrap();
    assert_eq!(s.propose(1, vec![9]), 0, "waiting");
    s.schedule(); // the first chunk of 4
    s.append_sampled(&[]);
    assert_eq!(s.propose(1, vec![9]), 0, "still prefilling");
    assert_eq!(s.propose(7, vec![9]), 0, "unknown");
    s.schedule();
    s.append_sampled(&[(1, 50)]);
    assert_eq!(s.propose(1, vec![9]), 1);
    // Tokens that do not extend the proposals are cut after the first that differs.
    s.schedule();
    s.append_tokens(&[(1, vec![8, 9, 9])]);
    assert_eq!(s.generated_tokens(1).unwrap(), &[50, 8]);
    s.check_invariants().unwrap();
}

#[test]
fn preemption_drops_proposals() {
    // Two sequences, 3 blocks of 2: the second one's growth preempts.
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        block_size: 2,
        num_blocks: 4,
        enable_prefix_caching: false,
    });
    prefilled(&mut s, 1, &[1, 2], 6, 10);
    s.add(2, vec![3, 4], 6).unwrap();
    s.propose(1, vec![11, 12, 13]);
    // Sequence 1 needs 3 blocks for positions 0..6, sequence 2 one: 4 of 4.
    let batch = s.schedule();
    s.check_invariants().unwrap();
    assert_eq!(batch.seqs.len(), 2);
    s.append_tokens(&[(1, vec![11, 12, 13, 14]), (2, vec![20])]);
    s.check_invariants().unwrap();
    assert_eq!(s.propose(2, vec![21, 22, 23]), 3);
    // Sequence 1's next decode needs a fourth block: the newest, sequence 2, is preempted
    // with its proposal, and may not take one while it waits.
    let batch = s.schedule();
    s.check_invariants().unwrap();
    assert_eq!(s.stats().preemptions, 1);
    assert!(batch.seqs.iter().all(|q| q.id != 2));
    assert!(!s.is_decoding(2));
    assert_eq!(s.propose(2, vec![21]), 0);
    s.append_tokens(
        &batch
            .seqs
            .iter()
            .filter(|q| q.sample)
            .map(|q| (q.id, vec![30]))
            .collect::<Vec<_>>(),
    );
    s.check_invariants().unwrap();
}
