//! The APIs and versions this broker speaks (docs/kafka.md, "APIs"): only those implemented and
//! tested. Capped below what the codec knows where a newer version needs what mmmq lacks or
//! changes shape: Fetch at 12 (13 names topics by id only), OffsetFetch at 7 (8 batches groups),
//! JoinGroup at 7 (8 and 9 add static-membership rules), Produce at 9.

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::ApiVersion;

/// `(api, min, max)`.
pub const SPOKEN: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 6),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// Whether `version` of `key` is spoken.
pub fn speaks(key: ApiKey, version: i16) -> bool {
    SPOKEN
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

/// The highest version of `key` spoken.
pub fn max_of(key: ApiKey) -> i16 {
    SPOKEN
        .iter()
        .find(|(k, ..)| *k == key)
        .map_or(-1, |&(_, _, max)| max)
}

/// The entries of an ApiVersions answer: every API, or ApiVersions' own only (the answer to a
/// version it does not speak, KIP-511).
pub fn entries(all: bool) -> Vec<ApiVersion> {
    SPOKEN
        .iter()
        .filter(|(k, ..)| all || *k == ApiKey::ApiVersions)
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Message;

    use super::*;

    /// Nothing is advertised that the codec cannot decode (its request ranges, not
    /// `ApiKey::valid_versions`, which are the responses').
    #[test]
    fn every_spoken_version_is_one_the_codec_decodes() {
        for &(key, min, max) in SPOKEN {
            let range = match key {
                ApiKey::Produce => ProduceRequest::VERSIONS,
                ApiKey::Fetch => FetchRequest::VERSIONS,
                ApiKey::ListOffsets => ListOffsetsRequest::VERSIONS,
                ApiKey::Metadata => MetadataRequest::VERSIONS,
                ApiKey::OffsetCommit => OffsetCommitRequest::VERSIONS,
                ApiKey::OffsetFetch => OffsetFetchRequest::VERSIONS,
                ApiKey::FindCoordinator => FindCoordinatorRequest::VERSIONS,
                ApiKey::JoinGroup => JoinGroupRequest::VERSIONS,
                ApiKey::Heartbeat => HeartbeatRequest::VERSIONS,
                ApiKey::LeaveGroup => LeaveGroupRequest::VERSIONS,
                ApiKey::SyncGroup => SyncGroupRequest::VERSIONS,
                ApiKey::DescribeGroups => DescribeGroupsRequest::VERSIONS,
                ApiKey::ListGroups => ListGroupsRequest::VERSIONS,
                ApiKey::SaslHandshake => SaslHandshakeRequest::VERSIONS,
                ApiKey::ApiVersions => ApiVersionsRequest::VERSIONS,
                ApiKey::CreateTopics => CreateTopicsRequest::VERSIONS,
                ApiKey::DeleteTopics => DeleteTopicsRequest::VERSIONS,
                ApiKey::InitProducerId => InitProducerIdRequest::VERSIONS,
                ApiKey::DescribeConfigs => DescribeConfigsRequest::VERSIONS,
                ApiKey::SaslAuthenticate => SaslAuthenticateRequest::VERSIONS,
                other => panic!("{other:?} has no range here"),
            };
            assert!(
                range.min <= min && max <= range.max,
                "{key:?} {min}..={max}"
            );
        }
    }
}
