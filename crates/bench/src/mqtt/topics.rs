//! Topic layout of the `mqtt` scenario: which topic each publisher publishes
//! to, which filters each subscriber subscribes to, and hence how many
//! subscribers should receive each publisher's messages (`--topic-mode`).

use super::args::TopicMode;

/// Topics and filters of one run.
#[derive(Debug)]
pub(super) struct TopicPlan {
    /// Publisher i's topic.
    pub(super) topics: Vec<String>,
    /// How many subscribers receive publisher i's messages.
    pub(super) matching: Vec<u64>,
    /// Subscriber j's topic filters.
    pub(super) filters: Vec<Vec<String>>,
}

/// Lays out the topics of `n_pub` publishers and `n_sub` subscribers under
/// `{prefix}/{run_id}/`.
pub(super) fn plan(
    mode: TopicMode,
    prefix: &str,
    run_id: &str,
    n_pub: usize,
    n_sub: usize,
) -> TopicPlan {
    let topics: Vec<String> = (0..n_pub)
        .map(|i| match mode {
            TopicMode::Shared => format!("{prefix}/{run_id}/shared"),
            TopicMode::PerPublisher | TopicMode::Wildcard => format!("{prefix}/{run_id}/p/{i}"),
        })
        .collect();
    // Which publishers' topics each subscriber subscribes to.
    let sub_topics: Vec<Vec<usize>> = (0..n_sub)
        .map(|j| match mode {
            TopicMode::Shared | TopicMode::Wildcard => (0..n_pub).collect(),
            TopicMode::PerPublisher if n_sub >= n_pub => vec![j % n_pub],
            TopicMode::PerPublisher => (0..n_pub).filter(|i| i % n_sub == j).collect(),
        })
        .collect();
    let mut matching = vec![0u64; n_pub];
    for list in &sub_topics {
        for &i in list {
            matching[i] += 1;
        }
    }
    let filters: Vec<Vec<String>> = sub_topics
        .iter()
        .map(|list| match mode {
            TopicMode::Shared => vec![topics[0].clone()],
            TopicMode::PerPublisher => list.iter().map(|&i| topics[i].clone()).collect(),
            TopicMode::Wildcard => vec![format!("{prefix}/{run_id}/p/+")],
        })
        .collect();
    TopicPlan {
        topics,
        matching,
        filters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_fan_in_sends_every_publisher_to_every_subscriber_through_one_filter() {
        let p = plan(TopicMode::Wildcard, "b", "r", 3, 2);
        assert_eq!(p.topics, ["b/r/p/0", "b/r/p/1", "b/r/p/2"]);
        assert_eq!(p.matching, [2, 2, 2]);
        assert_eq!(
            p.filters,
            [vec!["b/r/p/+".to_owned()], vec!["b/r/p/+".to_owned()]]
        );
    }

    #[test]
    fn shared_broadcast_sends_the_one_topic_to_every_subscriber() {
        let p = plan(TopicMode::Shared, "b", "r", 1, 4);
        assert_eq!(p.matching, [4]);
        assert!(p.filters.iter().all(|f| f == &["b/r/shared".to_owned()]));
    }
}
