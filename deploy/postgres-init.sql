-- The DBOS system database next to the application database (compose.yaml's Postgres init).
CREATE DATABASE refund_agent_dbos OWNER refunds;
