-- When each intent was recorded, so an operation's deadline survives a restart. And cluster
-- keys again, lowered as the server lowers them (ASCII only: PostgreSQL's lower() also folds
-- other letters, so migration 3 could disagree with the server).
ALTER TABLE intents ADD COLUMN recorded_at BIGINT;
DELETE FROM member_clusters;
INSERT INTO member_clusters (fleet, cluster_key, member)
    SELECT fleet, translate(body::jsonb #>> '{properties,clusterResourceId}',
                            'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'), name
    FROM resources WHERE kind = 'members' ORDER BY fleet, name
    ON CONFLICT DO NOTHING;
