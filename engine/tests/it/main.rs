mod catalog;
mod query;
mod store;
mod take;
