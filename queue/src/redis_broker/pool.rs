//! Dedicated connections for blocking reads (XREAD/XREADGROUP with BLOCK). A blocked command
//! holds its connection until it returns, so it must not share the multiplexed connection
//! every other operation uses.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};

use crate::error::Result;

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 64;

/// A small pool of connections without a response timeout (callers bound each wait).
#[derive(Debug)]
pub(crate) struct BlockingPool {
    client: Client,
    idle: Mutex<Vec<MultiplexedConnection>>,
}

impl BlockingPool {
    pub fn new(client: Client) -> Self {
        BlockingPool {
            client,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle connection (and `true`), or a new one (and `false`).
    pub async fn get(&self) -> Result<(MultiplexedConnection, bool)> {
        let reused = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(c) = reused {
            return Ok((c, true));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(None);
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((c, false))
    }

    /// Returns a connection whose last command completed normally. Connections whose command
    /// failed, timed out or was cancelled are dropped instead, never reused.
    pub fn put(&self, conn: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }
}
