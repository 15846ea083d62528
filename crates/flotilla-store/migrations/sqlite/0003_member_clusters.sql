-- A member's cluster id is unique in its fleet. Members registered twice before this keep their
-- rows; the first by name holds the id.
CREATE TABLE member_clusters (
    fleet TEXT NOT NULL, cluster_key TEXT NOT NULL, member TEXT NOT NULL,
    PRIMARY KEY (fleet, cluster_key));
INSERT OR IGNORE INTO member_clusters (fleet, cluster_key, member)
    SELECT fleet, lower(json_extract(body, '$.properties.clusterResourceId')), name
    FROM resources WHERE kind = 'members' ORDER BY fleet, name;
